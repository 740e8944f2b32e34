"""Several `cutegen eval` runs at once on one GPU, each with an honest candidate: no verdict may blame
the candidate (a rejection for memory or time); `gpu_busy` (not a verdict) is allowed, and counted.

    python3 bench/shared_gpu_h200.py --out DIR [--copies 4] [--prebuilt CACHE]

Starts the copies together (each its own process, evaluator and caches), waits for all, and writes
DIR/shared-gpu-h200.md and .json: per run, the exit status, the verdict, the failed check, the median
and the parent-clock ratio, with the machine manifest. Calls only the CLI. --prebuilt CACHE: each copy's
cache starts as a copy of CACHE (`cutegen prebuild` output), so the copies share the GPU, not nvcc.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from cutegen.manifest import machine_manifest  # noqa: E402

CANDIDATES = [("examples/candidates/swish_scale_cute.py", "examples/tasks/swish_scale.py"),
              ("examples/candidates/matmul_cute.py", "examples/tasks/matmul.py"),
              ("examples/candidates/row_softmax_cute.py", "examples/tasks/row_softmax.py"),
              ("examples/candidates/layer_norm_cute.py", "examples/tasks/layer_norm.py")]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--prebuilt", type=Path, help="A `cutegen prebuild` cache each copy starts from.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs, started = [], time.perf_counter()
    for i in range(args.copies):
        candidate, task = CANDIDATES[i % len(CANDIDATES)]
        env = {**os.environ, "CUTEGEN_CACHE": str(args.out / f"cache-{i}")}
        if args.prebuilt:
            shutil.copytree(args.prebuilt, args.out / f"cache-{i}", dirs_exist_ok=True)
        command = [sys.executable, "-m", "cutegen", "eval", candidate, "--task", task, "--json"]
        log = (args.out / f"run-{i}.log").open("w")
        runs.append((candidate, subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
                                                 text=True)))
    rows = []
    for candidate, proc in runs:
        out, _ = proc.communicate()
        try:
            verdict = json.loads(out)
        except json.JSONDecodeError:
            verdict = {}
        timing = verdict.get("timing") or {}
        rows.append({"candidate": candidate, "exit": proc.returncode, "passed": verdict.get("passed"),
                     "failure": verdict.get("failure"), "infrastructure": verdict.get("infrastructure"),
                     "median_ms": timing.get("median_ms"), "parent_clock_ratio": verdict.get("parent_clock_ratio"),
                     "gpu_s": verdict.get("gpu_s")})
    blamed = [r for r in rows if not r["passed"] and not r["infrastructure"]]
    result = {"manifest": machine_manifest(), "copies": args.copies, "wall_s": time.perf_counter() - started,
              "rows": rows, "blamed": len(blamed)}
    (args.out / "shared-gpu-h200.json").write_text(json.dumps(result, indent=1))
    lines = ["# Honest candidates evaluated at once on one GPU", "", "```", json.dumps(result["manifest"], indent=1),
             "```", "", f"{args.copies} `cutegen eval` processes started together; {result['wall_s']:.0f} s in all.",
             "", "| candidate | exit | verdict | failed check | median ms | parent/reported | GPU s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = "pass" if r["passed"] else ("not judged (gpu_busy)" if r["infrastructure"] else "reject")
        lines.append(f"| {r['candidate']} | {r['exit']} | {verdict} | {r['failure'] or '-'} | {_fmt(r['median_ms'])} |"
                     f" {_fmt(r['parent_clock_ratio'])} | {_fmt(r['gpu_s'])} |")
    lines += ["", f"Verdicts that blame an honest candidate: {len(blamed)}."]
    (args.out / "shared-gpu-h200.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-(len(rows) + 3):]))


if __name__ == "__main__":
    main()
