"""Whether the two timing protocols time the same forward alike: the baselines' (`time_forward`, input
sets cycled) and the candidate's (`time_batch`, inputs drawn right before each call, the persisting
L2 reset first). The task's reference forward (or a KernelBench-format candidate's ModelNew) is
timed under both, under variants of the candidate's that drop one of its differences at a time, on
each input set alone, and right after the worker's churn of free memory or an `empty_cache` (what
the device does after memory goes back to the driver). Calls the package's functions, no CLI.

    python3 bench/timing_protocol_h200.py --task KB/level1/47_Sum_reduction_over_a_dimension.py --out DIR
        [--candidate level_1_problem_47_sample_0_kernel.py]

Writes DIR/timing-protocol-h200-TASK.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

import torch  # noqa: E402
from _common import load_module  # noqa: E402

from cutegen.evaluate import timing  # noqa: E402
from cutegen.evaluate.checks_dynamic import churn_free_memory  # noqa: E402
from cutegen.evaluate.correctness import build_model, make_inputs  # noqa: E402
from cutegen.manifest import machine_manifest  # noqa: E402


def batched(fn, draw, calls: int, batch: int) -> list[float]:
    """`calls` timed calls by `time_batch`, `batch` at a time (their retained copies dropped between)."""
    times: list[float] = []
    done = 0
    while done < calls:
        n = min(batch, calls - done)
        run = timing.time_batch(fn, lambda i, base=done: draw(base + i), device=torch.device("cuda"), calls=n,
                                idle_limit_ms=None)
        times += run.times_ms
        del run
        done += n
    return times


def churn_lifo(device) -> None:
    """churn_free_memory's fill, its blocks freed in the reverse order of their allocation."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks, chunk = [], 1 << 30
    while chunk >= 2 << 20:
        try:
            blocks.append(torch.empty(chunk, dtype=torch.uint8, device=device).fill_(0xFF))
        except torch.cuda.OutOfMemoryError:
            chunk //= 2
    torch.cuda.synchronize()
    while blocks:
        del blocks[-1]
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--candidate", type=Path, help="a KernelBench-format file with ModelNew to time instead")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    module = load_module(args.task, "task")
    device = torch.device("cuda")
    model = build_model(module.Model, module.get_init_inputs(), 0, device)
    if args.candidate is not None:
        candidate = load_module(args.candidate, "candidate")
        model = build_model(candidate.ModelNew, module.get_init_inputs(), 0, device)
    sets = [make_inputs(module, 1000 + k, None, device, device) for k in range(2)]
    seeds = [int.from_bytes(os.urandom(4), "little") for _ in range(args.calls)]

    def fresh(i: int):
        return make_inputs(module, seeds[i], None, device, device)

    def fresh_waited(i: int):
        inputs = fresh(i)
        torch.cuda.synchronize()  # the draw finished before the flush and the call are queued
        return inputs

    def cycled(i: int):
        return sets[i % len(sets)]

    rows: dict[str, list[float]] = {}
    with torch.no_grad():
        model(*sets[0])
        rows["time_forward, 2 sets cycled (the baselines')"] = timing.time_forward(
            model, sets, device=device, trials=args.calls, warmup=3).times_ms
        rows["time_batch, fresh draws (the candidate's)"] = batched(model, fresh, args.calls, args.batch)
        rows["time_batch, 2 sets cycled"] = batched(model, cycled, args.calls, args.batch)
        rows["time_batch, fresh draws, waited for"] = batched(model, fresh_waited, args.calls, args.batch)
        reset = timing.reset_persisting_l2
        timing.reset_persisting_l2 = lambda: None
        try:
            rows["time_batch, fresh draws, no L2 reset"] = batched(model, fresh, args.calls, args.batch)
            rows["time_batch, 2 sets cycled, no L2 reset"] = batched(model, cycled, args.calls, args.batch)
        finally:
            timing.reset_persisting_l2 = reset
        for k, one in enumerate(sets):
            rows[f"time_forward, set {k} alone"] = timing.time_forward(model, [one], device=device,
                                                                      trials=args.calls, warmup=3).times_ms
        rows["time_forward again"] = timing.time_forward(model, sets, device=device, trials=args.calls,
                                                         warmup=3).times_ms
        # The worker churns free memory (checks_dynamic.churn_free_memory) before its timed calls:
        # every later allocation, the timed calls' inputs among them, is mapped anew.
        del sets[:]
        churn_free_memory(device)
        rows["time_batch, fresh draws, after a churn"] = batched(model, fresh, args.calls, args.batch)
        sets += [make_inputs(module, 2000 + k, None, device, device) for k in range(2)]
        rows["time_forward, 2 sets drawn after a churn"] = timing.time_forward(
            model, sets, device=device, trials=args.calls, warmup=3).times_ms
        del sets[:]
        for name, clear in (("empty_cache alone", torch.cuda.empty_cache), ("a churn again", lambda: churn_free_memory(device)),
                            ("a churn freed last-first", lambda: churn_lifo(device))):
            clear()
            rows[f"time_batch, fresh draws, after {name}"] = batched(model, fresh, args.calls, args.batch)
    stats = {name: timing.summarize(times) for name, times in rows.items()}
    name = args.task.stem + ("-" + args.candidate.stem if args.candidate else "")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = machine_manifest()
    (args.out / f"timing-protocol-h200-{name}.json").write_text(json.dumps(
        {"task": name, "calls": args.calls, "batch": args.batch, "times_ms": rows, "manifest": manifest}, indent=1))
    what = f"ModelNew of {args.candidate.name}" if args.candidate else "The task's reference forward"
    lines = [f"# One forward under the two timing protocols: {name}", "",
             f"{what}, {args.calls} timed calls per row (time_batch {args.batch} at a time).", "",
             "| protocol | median ms | IQR ms | min ms |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {s.median_ms:.4g} | {s.iqr_ms:.3g} | {s.min_ms:.4g} |" for k, s in stats.items()]
    lines += ["", "```json", json.dumps(manifest, indent=1), "```", ""]
    (args.out / f"timing-protocol-h200-{name}.md").write_text("\n".join(lines))
    print("\n".join(lines[:len(stats) + 6]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
