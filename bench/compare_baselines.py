"""Compare the baselines of two survey files, (task, track) by (task, track).

    python3 bench/compare_baselines.py A.json B.json --out COMPARISON.md [--label-a fresh] [--label-b reused]

A and B are files written by `cutegen survey` (before it, by bench/baselines_kernelbench_h200.py, in
the same format). For every (task, track) that both
measured, the eager and the torch.compile medians of B are set against A's (B / A - 1, in percent),
beside each side's eager noise and worker job (which job of its worker the measurement was; "-" for
records from before the field existed, each made in a fresh worker). The table ends with the median,
the mean absolute and the extreme differences per track and kind, and the machines of both files.
Measures nothing: it reads two files, so it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

from cutegen.survey.probe import task_order  # noqa: E402

KINDS = ("eager", "compiled")


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (task, track, kind) with a median in both files."""
    rows = []
    for task_id in sorted(set(a["tasks"]) & set(b["tasks"]), key=task_order):
        for track in ("fp32", "tf32"):
            row_a = a["tasks"][task_id].get("tracks", {}).get(track) or {}
            row_b = b["tasks"][task_id].get("tracks", {}).get(track) or {}
            for kind in KINDS:
                ms_a = (row_a.get(kind) or {}).get("median_ms")
                ms_b = (row_b.get(kind) or {}).get("median_ms")
                if ms_a and ms_b:
                    rows.append({"task_id": task_id, "track": track, "kind": kind, "a_ms": ms_a, "b_ms": ms_b,
                                 "diff_pct": 100.0 * (ms_b / ms_a - 1.0), "a_noise_pct": row_a.get("noise_pct"),
                                 "b_noise_pct": row_b.get("noise_pct"), "a_job": row_a.get("worker_job"),
                                 "b_job": row_b.get("worker_job")})
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for track in ("fp32", "tf32"):
        for kind in KINDS:
            diffs = [r["diff_pct"] for r in rows if r["track"] == track and r["kind"] == kind]
            if diffs:
                out.append({"track": track, "kind": kind, "n": len(diffs), "median_pct": statistics.median(diffs),
                            "mean_abs_pct": statistics.mean(abs(d) for d in diffs), "min_pct": min(diffs),
                            "max_pct": max(diffs)})
    return out


def markdown(rows: list[dict[str, Any]], a: dict[str, Any], b: dict[str, Any], label_a: str, label_b: str) -> str:
    def cell(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [f"# Baselines compared: {label_b} against {label_a}", "",
             f"{len(rows)} (task, track, kind)s measured in both; difference = {label_b} / {label_a} - 1.", "",
             "| track | kind | n | median % | mean abs % | min % | max % |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {s['track']} | {s['kind']} | {s['n']} | {s['median_pct']:+.2f} | {s['mean_abs_pct']:.2f} |"
              f" {s['min_pct']:+.2f} | {s['max_pct']:+.2f} |" for s in summary(rows)]
    lines += ["", f"| task | track | kind | {label_a} ms | {label_b} ms | difference % | eager noise % ({label_a} /"
              f" {label_b}) | worker job ({label_a} / {label_b}) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['task_id']} | {r['track']} | {r['kind']} | {r['a_ms']:.4g} | {r['b_ms']:.4g} | {r['diff_pct']:+.2f}"
              f" | {cell(r['a_noise_pct'], '.2f')} / {cell(r['b_noise_pct'], '.2f')} | {cell(r['a_job'], 'd')} /"
              f" {cell(r['b_job'], 'd')} |" for r in rows]
    for label, state in ((label_a, a), (label_b, b)):
        m = state.get("manifest") or {}
        lines.append(f"\n{label}: {m.get('gpu_name')}, driver {m.get('driver_version')}, torch {m.get('torch_version')};"
                     f" runs started {', '.join(r.get('started_utc', '?')[:16] for r in state.get('runs', []))}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label-a", default="A")
    parser.add_argument("--label-b", default="B")
    args = parser.parse_args(argv)
    states = []
    for path in (args.a, args.b):
        try:
            states.append(json.loads(path.read_text()))
        except (OSError, ValueError) as err:
            parser.error(f"{path}: cannot read a baselines file ({err}); give files written by"
                         " `cutegen survey`")
        if "tasks" not in states[-1]:
            parser.error(f"{path}: no 'tasks' in it; give files written by `cutegen survey`")
    rows = differences(*states)
    args.out.write_text(markdown(rows, *states, args.label_a, args.label_b))
    for s in summary(rows):
        print(f"{s['track']} {s['kind']}: n {s['n']}, median {s['median_pct']:+.2f}%, mean |d| {s['mean_abs_pct']:.2f}%,"
              f" range {s['min_pct']:+.2f}% .. {s['max_pct']:+.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
