"""Where a task's reference process holds device memory: after its trials (with the trivial-solution
probe), each baseline in the lane's order (compile, eager, compiled), `trim`, serving one candidate
(its outputs stood in for by copies of the reference's, one element moved: every comparison, the
ghost probe's plan and judgements), and the float64 deltas of every trial. Prints, at each step,
torch's allocated and reserved bytes and the live tensors by size, so that memory the process keeps
by mistake has a name. Arranges calls of `cutegen.evaluate.reference.ReferenceSession`.

    python bench/reference_memory.py TASK_FILE [--device cuda] [--no-compile] [--out FILE]

On an H200 (2026-12-02), level1/36's reference held 49 GiB after `trim` here, while the driver
listed the same task's reference process in a full evaluation with 98.6 GiB.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path


def live_tensors(device_type: str) -> list[tuple[int, str]]:
    """(bytes, description) of every live tensor storage on `device_type`, largest first, each
    storage once."""
    import torch

    seen: dict[int, tuple[int, str]] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device.type != device_type:
                continue
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key not in seen:
                seen[key] = (storage.nbytes(), f"{tuple(obj.shape)} {str(obj.dtype).removeprefix('torch.')}")
        except Exception:  # noqa: BLE001 - a tensor without storage (meta, sparse): not device memory
            continue
    return sorted(seen.values(), reverse=True)


def serve_one_candidate(session) -> None:
    """What the reference process computes for one candidate, on copies of its own outputs."""
    import torch

    from cutegen.evaluate import checks_dynamic as dyn
    from cutegen.evaluate.compare import compare_outputs, flatten_outputs

    for trial in session.trials:
        if trial.reference is None:
            continue
        refs = flatten_outputs(trial.reference)
        outs = [r.clone() for r in refs]
        outs[0].view(-1)[0] += 1.0  # not identical: the full float64 comparison runs
        compare_outputs(outs, refs, session.atol, session.rtol)
        del outs
    plan = session.ghost_plan({"tol": 1e-4})["plan"]
    base = [r.clone() for r in flatten_outputs(session.trials[0].reference)]
    for entry in plan:
        moved = [b.clone() for b in base]
        mask = dyn.moved_mask(base, moved, 1e-4, dyn.GHOST_CANDIDATE_FACTOR)
        dyn.ghost_finding(entry["index"], entry["position"], mask, session.ghost_masks[entry["index"]])
        del moved, mask
    del base
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from cutegen.config import EvalConfig
    from cutegen.evaluate.jobs import reference_job
    from cutegen.evaluate.reference import ReferenceSession
    from cutegen.tasks import load_task

    config = EvalConfig(device=args.device, backend="cute" if args.device == "cuda" else "torch")
    task = load_task(args.task)
    job = reference_job(task, config, trials=config.correctness_trials, adversarial=config.adversarial_trials,
                        weight_seeds=config.weight_seeds, probe=True)
    session = ReferenceSession(job)
    steps: list[dict] = []

    def note(step: str, started: float) -> None:
        gc.collect()
        cuda = args.device == "cuda"
        tensors = live_tensors("cuda" if cuda else "cpu")
        row = {"step": step, "s": round(time.perf_counter() - started, 2),
               "allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 2) if cuda else None,
               "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2) if cuda else None,
               "live_gib": round(sum(b for b, _ in tensors) / 2**30, 3),
               "largest": [f"{b / 2**30:.2f} GiB {d}" for b, d in tensors[:12]]}
        steps.append(row)
        print(json.dumps(row), flush=True)

    started = time.perf_counter()
    session.reference()
    note("reference", started)
    for kind in (() if args.no_compile else ("compile",)) + ("eager",) + (() if args.no_compile else ("compiled",)):
        started = time.perf_counter()
        session.baseline({"kind": kind})
        note(f"baseline {kind}", started)
    started = time.perf_counter()
    session.trim()
    note("trim", started)
    started = time.perf_counter()
    serve_one_candidate(session)
    note("one candidate served", started)
    started = time.perf_counter()
    for index in range(len(session.trials)):
        session._delta(index)
    note("deltas of every trial", started)
    if args.out:
        args.out.write_text(json.dumps(steps, indent=1))


if __name__ == "__main__":
    main()
