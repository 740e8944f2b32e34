"""The throughput table over one or more parts of bench/throughput_h200.py, merged.

    python3 bench/throughput_report.py --out DIR PART.json [PART.json ...]

Evaluations per GPU-minute over all parts (evaluations over the sum of the parts' wall times), the
build, first-evaluation and stage medians (the package's own `cutegen.bench.throughput_summary`), the
per-task rows, the Nsight Compute comparisons, and the figures before the per-task reference process as
the issue that asked for it measured them. Writes DIR/throughput-h200.md and .json; reads files only.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

from cutegen.bench import throughput_summary  # noqa: E402
from cutegen.journal import from_json  # noqa: E402
from cutegen.records import Verdict  # noqa: E402

# Before: the evaluator as it was, measured by an end-to-end run (a frontier model's kernels for 8
# full-size tasks, 15 evaluations on the H200), as recorded in the issue that asked for this design.
BEFORE = {
    "source": "15 evaluations of model-written kernels on 8 full-size tasks (0.07-2.8 GB per forward), H200,"
              " before the per-task reference process (recorded in the throughput issue)",
    "evaluations_per_gpu_minute": 0.7, "median_s_per_evaluation": 64.0,
    "stage_median_s": {"reference": 16.6, "baselines": 8.1, "build": 10.9, "correctness": 9.0, "anticheat": 3.1,
                       "timing": 1.4},
    "stage_max_s": {"reference": 176.8, "baselines": 31.2, "build": 40.7, "correctness": 26.5, "anticheat": 14.7,
                    "timing": 3.9},
}


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def after(parts: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the merged figures, the stage medians) from every part's verdicts, with the parts' wall times
    added up (a part cut off by its budget wrote no throughput.json: its wall time is the command's)."""
    verdicts = [v for p in parts for v in p["bench"]["verdicts"]]
    records = [from_json(Verdict, v["record"]) for v in verdicts if v.get("record")]
    runs = [p["bench"]["throughput"] or {} for p in parts]
    wall = sum(t.get("wall_s") or p["bench"]["wall_s"] for t, p in zip(runs, parts))
    summary = throughput_summary(records, wall, lanes=max((t.get("lanes", 1) for t in runs), default=1),
                                 build_jobs=max((t.get("build_jobs", 1) for t in runs), default=1))
    first, built = summary["first"], summary["built"]
    return {"evaluations": len(verdicts), "passed": sum(bool(v["passed"]) for v in verdicts),
            "tasks": len({v["task_id"] for v in verdicts}), "wall_s": round(wall, 1),
            "evaluations_per_gpu_minute": summary["per_gpu_minute"], "built_median_gpu_s": built["median_gpu_s"],
            "built_p90_gpu_s": built["p90_gpu_s"], "first_median_gpu_s": first["median_gpu_s"],
            "first_median_reference_s": first["median_reference_s"],
            "first_median_baselines_s": first["median_baselines_s"], "median_gpu_s": summary["median_gpu_s"]}, \
        summary["stage_median_s"]


def measure_lines(a: dict[str, Any], stages: dict[str, Any], verdicts: list[dict[str, Any]]) -> list[str]:
    why = collections.Counter("task error" if v["task_error"] is not None else f"{v['failure']}"
                              for v in verdicts if not v["passed"])
    not_accepted = f" Not accepted: {sum(why.values())} ({', '.join(f'{k}: {n}' for k, n in why.most_common())})." \
        if why else ""
    return ["| measure | before | after | goal |", "| --- | --- | --- | --- |",
            f"| evaluations per GPU-minute, builds included | {BEFORE['evaluations_per_gpu_minute']} |"
            f" {a['evaluations_per_gpu_minute']} ({a['evaluations']} evaluations, {a['wall_s']} s) | >= 4 |",
            f"| GPU s per evaluation of a built candidate, task's reference ready: median | - | {a['built_median_gpu_s']}"
            " | <= 10 |", f"| same, 90th percentile | - | {a['built_p90_gpu_s']} | <= 20 |",
            f"| GPU s of a task's first evaluation (reference and baselines): median | - | {a['first_median_gpu_s']}"
            f" (reference {a['first_median_reference_s']}, baselines {a['first_median_baselines_s']}) | <= 30 |",
            f"| seconds per evaluation, all: median | {BEFORE['median_s_per_evaluation']} | {a['median_gpu_s']}"
            " (GPU-held) | |", "", f"Before: {BEFORE['source']}; its stage medians (max): "
            + ", ".join(f"{k} {BEFORE['stage_median_s'][k]} ({BEFORE['stage_max_s'][k]})" for k in BEFORE["stage_median_s"])
            + ". Not measured again on these candidates.", "",
            f"{a['passed']} of {a['evaluations']} evaluations passed, over {a['tasks']} tasks." + not_accepted, "",
            "Median seconds of each step over the evaluations that ran it (build_pool runs on the CPU, beside the GPU;"
            " every other step holds the GPU lane):", "", "| " + " | ".join(stages) + " |", "|" + " --- |" * len(stages),
            "| " + " | ".join(str(v) for v in stages.values()) + " |", ""]


def row_lines(verdicts: list[dict[str, Any]], profiles: list[dict[str, Any]]) -> list[str]:
    order = sorted({v["task_id"] for v in verdicts}, key=lambda t: [int(p) if p.isdigit() else p for p in t.split("/")])
    lines = ["| task | sample | passed | GPU s | reference s | baselines s | median ms | x eager | SOL |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {v['task_id']} | {v['sample']} | {v['passed'] if v['task_error'] is None else 'task error'} |"
              f" {v['gpu_s']} | {v['stage_s'].get('reference', '')} | {v['stage_s'].get('baselines', '')} |"
              f" {_fmt(v['median_ms'])} | {_fmt(v['speedup_vs_eager'])} | {_fmt(v['sol_fraction'])} |"
              for v in sorted(verdicts, key=lambda v: (order.index(v["task_id"]), v["sample"] or 0))]
    if profiles:
        lines += ["", "Nsight Compute (one forward, `cutegen profile`) against the full evaluation's medians:", "",
                  "| candidate | ncu ms | evaluation median ms | stream median | idle median | calls timed to idle |"
                  " evaluation / ncu |", "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['candidate']} | {_fmt(r.get('ncu_ms'))} | {_fmt(r.get('evaluation_median_ms'))} |"
                  f" {_fmt(r.get('stream_median_ms'))} | {_fmt(r.get('idle_median_ms'))} | {r.get('past_stream_trials')} |"
                  f" {_fmt(r.get('evaluation_over_ncu'))} |" + (f" error: {r['error'][:120]!r}" if r.get("error") else "")
                  for r in profiles]
    return lines


def report(parts: list[dict[str, Any]], out: Path) -> str:
    """The merged table, written to OUT/throughput-h200.md (and the figures to .json); its text."""
    verdicts = [v for p in parts for v in p["bench"]["verdicts"]]
    figures, stages = after(parts)
    m = (parts[0]["manifest"] if parts else None) or {}
    lines = ["# Full-size evaluation throughput on the H200", "",
             f"Machine: {m.get('gpu_name')}, driver {m.get('driver_version')}, torch {m.get('torch_version')}, CUDA"
             f" {m.get('cuda_runtime')}, nvcc {m.get('nvcc_version')}, CUTLASS {m.get('cutlass_version')},"
             f" {m.get('cpu_count')} CPU cores; {m.get('timestamp_utc')}.", "", "Commands (one device call per part):", ""]
    lines += [f"- `{p['bench']['command']}`" + (" (stopped by its time budget: the evaluations it finished are counted"
              f" over its {p['bench']['wall_s']:.0f} s)" if p["bench"]["status"] == "timeout" else "") for p in parts]
    text = "\n".join(lines + [""] + measure_lines(figures, stages, verdicts)
                     + row_lines(verdicts, [r for p in parts for r in p["profiles"]])) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput-h200.md").write_text(text)
    (out / "throughput-h200.json").write_text(json.dumps({"before": BEFORE, "after": figures, "stage_median_s": stages,
                                                          "parts": [p["part"] for p in parts]}, indent=1))
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("parts", nargs="+", type=Path, help="throughput-h200-PART.json files")
    args = parser.parse_args()
    print(report([json.loads(p.read_text()) for p in args.parts], args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
