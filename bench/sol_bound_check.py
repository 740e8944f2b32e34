"""Check the reference algorithm's work bound against the KernelBench baselines measured on the H200.

    python3 bench/sol_bound_check.py [--baselines bench/results/baselines-h200.json]
                                     [--kernelbench DIR] [--out bench/results/sol-bound-check.md]

The work bound (`cutegen.evaluate.sol.work_bound_ms`: the reference's FLOPs and minimum bytes at the
hardware's peaks, the larger of datasheet and measured) is what every "% of the work bound" the product
prints is a fraction of, so no eager or torch.compile time may be faster than it: one that is means a
wrong FLOP or byte count, or a peak set too low. Beside it, under its own name, the achievable bound:
the same formula at the peaks measured on the device (a 1 GiB copy), which torch.compile's reductions
beat. With --kernelbench (or CUTEGEN_KERNELBENCH) each task is traced again with this checkout's tracer
and its source checked against the one measured; without it the traces stored with the baselines are
used. Writes the table; exit status 1 when a time beats its work bound or a trace no longer matches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

BASELINES = REPO / "bench" / "results" / "baselines-h200.json"
OUT = REPO / "bench" / "results" / "sol-bound-check.md"


def task_order(task_id: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", task_id))


def current_traces(kernelbench: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Each measured task traced again from the checkout: {task_id: (trace, source_sha256)}."""
    from cutegen.tasks import load_tasks
    from cutegen.trace import trace_task

    levels = sorted({f"level{entry['level']}" for entry in state["tasks"].values()})
    tasks = [task for level in levels for task in load_tasks(kernelbench, level) if task.task_id in state["tasks"]]
    return {task.task_id: (trace_task(task), task.source_sha256) for task in tasks}


def check_rows(state: dict[str, Any], traces: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per task and track: both bounds, both baselines, and the fraction of each bound that the
    faster baseline reaches. `traces` (from `current_traces`) replaces the stored traces."""
    from cutegen.config import HALF_DTYPES
    from cutegen.evaluate.sol import sol_bound_ms, work_bound_ms
    from cutegen.journal import from_json
    from cutegen.records import Peaks

    measured = from_json(Peaks, state["peaks"]["peaks"])
    rows = []
    for task_id, entry in sorted(state["tasks"].items(), key=lambda kv: task_order(kv[0])):
        stored = SimpleNamespace(**entry["trace"])
        trace, stale = stored, None
        if traces is not None:
            trace, sha = traces.get(task_id, (None, None))
            if trace is None or sha != entry["source_sha256"]:
                stale = "task missing or changed since it was measured"
            elif (trace.flops, trace.min_bytes) != (stored.flops, stored.min_bytes):
                stale = f"trace now {trace.flops} FLOPs, {trace.min_bytes} B; measured with {stored.flops}, {stored.min_bytes}"
        for track, row in sorted(entry["tracks"].items()):
            times = {name: row[name]["median_ms"] for name in ("eager", "compiled") if row.get(name)}
            half = (row.get("sol_precision") or "float32").split()[0] in HALF_DTYPES
            work = work_bound_ms(trace, measured, track, half) if trace is not None else None
            achievable = sol_bound_ms(trace, measured, track, half) if trace is not None else None
            fastest = min(times.values()) if times else None
            rows.append({"task_id": task_id, "track": track, "eager_ms": times.get("eager"),
                         "compiled_ms": times.get("compiled"), "work_bound_ms": work, "achievable_ms": achievable,
                         "work_fraction": work / fastest if work and fastest else None,
                         "achievable_fraction": achievable / fastest if achievable and fastest else None,
                         "stale": stale})
    return rows


def markdown(state: dict[str, Any], rows: list[dict[str, Any]], traced: bool) -> str:
    peaks = state["peaks"]["peaks"]
    beyond = [r for r in rows if (r["work_fraction"] or 0) > 1.0]
    past_achievable = [r for r in rows if (r["achievable_fraction"] or 0) > 1.0]
    unbounded = [r for r in rows if r["work_fraction"] is None]
    stale = sorted({r["task_id"] for r in rows if r["stale"]}, key=task_order)
    top = sorted((r for r in rows if r["work_fraction"]), key=lambda r: -r["work_fraction"])[:15]

    def num(value: float | None, pattern: str = "{:.4g}") -> str:
        return "-" if value is None else pattern.format(value)

    lines = ["# The reference algorithm's work bound against the KernelBench baselines", "",
             "Written by `python3 bench/sol_bound_check.py` from `bench/results/baselines-h200.json`"
             f" ({len(state['tasks'])} tasks, fp32 and tf32 tracks, {peaks['device_name']}, torch"
             f" {state['peaks']['torch_version']}).", "",
             "Work bound: max(FLOPs / compute peak, minimum bytes / bandwidth) of the reference at the hardware's"
             " peaks, the larger of datasheet and measured (`sol.work_bound_ms`); every fraction the product prints"
             " is of it. Achievable bound: the same at the peaks measured on the device"
             f" ({peaks['bandwidth_gb_s']:.0f} GB/s, {peaks['half_tflops']:.0f} TFLOP/s bf16), shown under its own"
             " name: a very good kernel reaches it, it is no limit.", "",
             f"Traces: {'traced again from the KernelBench checkout' if traced else 'as stored with the baselines'}.",
             "", "| count | value |", "|---|---|",
             f"| task-track pairs checked | {len(rows)} |",
             f"| eager or torch.compile faster than the work bound | **{len(beyond)}** |",
             f"| faster than the achievable bound (measured peaks) | {len(past_achievable)} |",
             f"| without a bound (trace failed) | {len(unbounded)} |",
             f"| traces changed since the baselines were measured | {len(stale)} |",
             f"| highest fraction of the work bound | {num(top[0]['work_fraction'] if top else None, '{:.1%}')} |",
             "", "Beyond the work bound: " + (", ".join(f"{r['task_id']} ({r['track']})" for r in beyond) or "none") + ".",
             "", "Faster than the achievable bound but under the work bound: "
             + (", ".join(f"{r['task_id']} ({r['track']})" for r in past_achievable) or "none") + ".",
             "", "## The closest to the work bound", "",
             "| task | track | eager ms | torch.compile ms | work bound ms | of work bound | achievable ms | of achievable |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['task_id']} | {r['track']} | {num(r['eager_ms'])} | {num(r['compiled_ms'])} | {num(r['work_bound_ms'])}"
              f" | {num(r['work_fraction'], '{:.1%}')} | {num(r['achievable_ms'])} | {num(r['achievable_fraction'], '{:.1%}')} |"
              for r in top]
    if stale:
        lines += ["", "Changed traces: " + ", ".join(stale) + "."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baselines", type=Path, default=BASELINES)
    parser.add_argument("--kernelbench", type=Path, default=os.environ.get("CUTEGEN_KERNELBENCH"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    state = json.loads(args.baselines.read_text(encoding="utf-8"))
    traces = current_traces(args.kernelbench, state) if args.kernelbench else None
    rows = check_rows(state, traces)
    args.out.write_text(markdown(state, rows, traces is not None), encoding="utf-8")
    beyond = sum((r["work_fraction"] or 0) > 1.0 for r in rows)
    stale = sum(r["stale"] is not None for r in rows)
    print(f"{len(rows)} task-track pairs: {beyond} faster than the work bound, {stale} with a changed trace ({args.out})")
    return 1 if beyond or stale else 0


if __name__ == "__main__":
    sys.exit(main())
