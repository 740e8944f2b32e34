"""Full-size evaluation throughput on the GPU, one part per device call: `cutegen bench --evaluate` over
KernelBench tasks with hand-written honest candidates (bench/candidates/throughput/, or another folder
with --candidates), then `cutegen profile` (Nsight Compute) on some of them, set against the medians of
their full evaluations. Calls only the CLI.

    python3 bench/throughput_h200.py --out DIR --kernelbench KB --select SEL --part NAME [--profile STEMS]
        [--candidates DIR] [--variants N] [--extra "MORE BENCH ARGUMENTS"] [--budget-s S]

The bench runs with a fresh cache (cold builds, baselines, probes and torch.compile) and its log keeps
the one line per verdict the CLI prints. Writes DIR/throughput-h200-PART.json (the CLI's throughput.json,
every verdict's stage seconds, the profiles, the machine manifest of `cutegen machine`) and the part's
own table (bench/throughput_report.py, which also merges several parts).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import cutegen_json, shown
from throughput_report import report

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "bench" / "candidates" / "throughput"


def with_variants(folder: Path, count: int, into: Path) -> Path:
    """A folder holding each sample-0 file of `folder` and `count - 1` variants of it (samples 1, 2...):
    sample k caps a grid-stride kernel's grid at 32 >> k blocks per SM where the file has that cap (a
    different launch), and always renames its `load_inline` extension (a different source, built alone)."""
    into.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.glob("*_sample_0_kernel.py")):
        source = path.read_text(encoding="utf-8")
        (into / path.name).write_text(source, encoding="utf-8")
        for k in range(1, count):
            variant = source.replace("multiProcessorCount * 32", f"multiProcessorCount * {32 >> k}")
            variant = re.sub(r'name="([A-Za-z0-9_]+)"', lambda m: f'name="{m.group(1)}_s{k}"', variant, count=1)
            note = (f"# Sample {k}: sample 0 with its grid capped at {32 >> k} blocks per SM and its extension renamed."
                    if variant.count(f"multiProcessorCount * {32 >> k}") else
                    f"# Sample {k}: sample 0's kernel with its extension renamed (built on its own).")
            (into / path.name.replace("_sample_0_", f"_sample_{k}_")).write_text(note + "\n" + variant, encoding="utf-8")
    return into


def verdict_row(record: dict[str, Any]) -> dict[str, Any]:
    """One line of the run's verdicts.jsonl, as the report reads it."""
    verdict = record.get("verdict") or {}
    timing = verdict.get("timing") or {}
    return {"record": verdict or None, "task_id": record["task_id"], "sample": record["sample_id"],
            "task_error": record.get("task_error"), "passed": verdict.get("passed"), "failure": verdict.get("failure"),
            "gpu_s": verdict.get("gpu_s"), "stage_s": dict(verdict.get("stage_s") or []),
            **{k: timing.get(k) for k in ("median_ms", "stream_median_ms", "idle_median_ms", "past_stream_trials")},
            "speedup_vs_eager": verdict.get("speedup_vs_eager"), "sol_fraction": verdict.get("sol_fraction"),
            "feedback": (verdict.get("feedback") or "")[:300]}


def run_bench(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    run_dir, log_path = args.out / "runs" / args.part, args.out / f"bench-log-{args.part}.txt"
    cmd = [sys.executable, "-m", "cutegen", "bench", str(args.kernelbench), "--select", args.select, "--evaluate",
           str(args.candidates), "--runs-dir", str(args.out / "runs"), "--run-id", args.part, "--no-report",
           *args.extra.split()]
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            status: Any = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.budget_s).returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    places = {args.out: "$OUT"}
    log_path.write_text(shown(log_path.read_text(encoding="utf-8"), REPO, places), encoding="utf-8")
    throughput, verdicts = run_dir / "throughput.json", run_dir / "verdicts.jsonl"
    return {"command": shown(" ".join(cmd), REPO, places), "status": status, "wall_s": time.perf_counter() - started,
            "throughput": json.loads(throughput.read_text()) if throughput.is_file() else None,
            "verdicts": [verdict_row(json.loads(line)) for line in verdicts.read_text().splitlines()]
            if verdicts.is_file() else []}


def profile_one(name: str, args: argparse.Namespace, env: dict[str, str], verdict: dict | None) -> dict[str, Any]:
    """`cutegen profile` (one forward) of a candidate file: the kernels' total duration, beside its evaluation."""
    task_id = f"level{name.split('_')[1]}/{name.split('_')[3]}"
    started = time.perf_counter()
    found = cutegen_json(["profile", str(args.candidates / f"{name}.py"), "--task", str(args.kernelbench), "--select",
                          task_id, "--json", "--timeout", "170"], env, 200)
    row: dict[str, Any] = {"candidate": name, "task_id": task_id, "wall_s": time.perf_counter() - started}
    try:
        row.update(ncu_ms=found["profile"]["total_duration_s"] * 1e3, kernels=len(found["profile"]["kernels"]))
    except (KeyError, TypeError):
        row["error"] = str(found)[-1500:]
    if verdict and row.get("ncu_ms") and verdict.get("median_ms"):
        row.update({k: verdict[k] for k in ("stream_median_ms", "idle_median_ms", "past_stream_trials")},
                   evaluation_median_ms=verdict["median_ms"], evaluation_over_ncu=verdict["median_ms"] / row["ncu_ms"])
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kernelbench", type=Path, required=True)
    parser.add_argument("--select", default="level1:19-32")
    parser.add_argument("--part", default="part1")
    parser.add_argument("--budget-s", type=float, default=480.0, help="The bench's time limit (it resumes).")
    parser.add_argument("--profile", default="", help="Candidate file stems to profile after the bench.")
    parser.add_argument("--candidates", type=Path, default=CANDIDATES, help="The folder of candidate files.")
    parser.add_argument("--variants", type=int, default=1, help="Samples per task made from each sample-0 file.")
    parser.add_argument("--extra", default="", help="More arguments for `cutegen bench` (e.g. --build-jobs 8).")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUTEGEN_CACHE": tempfile.mkdtemp(prefix="cutegen-throughput-cache-"), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}
    if args.variants > 1:
        args.candidates = with_variants(args.candidates, args.variants, args.out / f"candidates-{args.part}")
    result = {"part": args.part, "select": args.select,
              "manifest": cutegen_json(["machine", "--no-peaks", "--json"], env, 120).get("manifest"),
              "bench": run_bench(args, env), "profiles": []}
    by_name = {f"level_{v['task_id'][5:].replace('/', '_problem_')}_sample_{v['sample']}_kernel": v
               for v in result["bench"]["verdicts"]}
    result["profiles"] = [profile_one(n, args, env, by_name.get(n)) for n in args.profile.split(",") if n]
    (args.out / f"throughput-h200-{args.part}.json").write_text(json.dumps(result, indent=1, default=str))
    print(report([result], args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
