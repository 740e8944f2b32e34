"""Full-size evaluation throughput on the GPU: `cutegen bench --evaluate` over KernelBench tasks with
hand-written honest candidates (bench/candidates/throughput/, three samples per task), then Nsight
Compute on some of them against the medians of their full evaluations.

    python3 bench/throughput_h200.py --out DIR --kernelbench KB --select SEL --part NAME [--profile ...]
    python3 bench/throughput_h200.py --report-only --out DIR PART.json [PART.json ...]

A part is one device call: the bench runs under the CLI (`python3 -m cutegen bench KB --select SEL
--evaluate ...`), with a fresh cache (cold builds, baselines, probes and torch.compile), and its log
keeps the one line per verdict the CLI prints; the part's JSON holds the CLI's throughput.json, every
verdict's stage seconds and the profiles. `--report-only` merges parts into throughput-h200.md: the
throughput over all parts (evaluations over the sum of the parts' wall times), the per-task rows, the
stage medians, and the figures before this design as the issue that asked for it measured them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import shown

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "bench" / "candidates" / "throughput"
# Before: the evaluator as it was, measured by an end-to-end run (a frontier model's kernels for 8
# full-size tasks, 15 evaluations on the H200), as recorded in the issue that asked for this design.
BEFORE = {
    "source": "15 evaluations of model-written kernels on 8 full-size tasks (0.07-2.8 GB per forward), H200,"
              " before the per-task reference process (recorded in the throughput issue)",
    "evaluations_per_gpu_minute": 0.7,
    "median_s_per_evaluation": 64.0,
    "stage_median_s": {"reference": 16.6, "baselines": 8.1, "build": 10.9, "correctness": 9.0, "anticheat": 3.1,
                       "timing": 1.4},
    "stage_max_s": {"reference": 176.8, "baselines": 31.2, "build": 40.7, "correctness": 26.5, "anticheat": 14.7,
                    "timing": 3.9},
}


def _shown(text: str, args: argparse.Namespace) -> str:
    return shown(text, REPO, {args.out: "$OUT"})


def with_variants(folder: Path, count: int, into: Path) -> Path:
    """A folder holding each sample-0 file of `folder` and `count - 1` variants of it (samples 1, 2...),
    so that a folder with one candidate per task gives several honest ones: sample k caps a grid-stride
    kernel's grid at 32 >> k blocks per SM where the file has that cap (a different launch), and
    always renames its `load_inline` extension (a different source, built on its own)."""
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


def run_bench(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    run_dir = args.out / "runs" / args.part
    cmd = [sys.executable, "-m", "cutegen", "bench", str(args.kernelbench), "--select", args.select,
           "--evaluate", str(args.candidates), "--runs-dir", str(args.out / "runs"), "--run-id", args.part,
           "--no-report", *args.extra.split()]
    started = time.perf_counter()
    with open(args.out / f"bench-log-{args.part}.txt", "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.budget_s)
            status = done.returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    log_path = args.out / f"bench-log-{args.part}.txt"
    log_path.write_text(_shown(log_path.read_text(encoding="utf-8"), args), encoding="utf-8")
    result: dict[str, Any] = {"command": _shown(" ".join(cmd), args), "status": status,
                              "wall_s": time.perf_counter() - started}
    throughput = run_dir / "throughput.json"
    result["throughput"] = json.loads(throughput.read_text()) if throughput.is_file() else None
    verdicts = []
    if (run_dir / "verdicts.jsonl").is_file():
        for line in (run_dir / "verdicts.jsonl").read_text().splitlines():
            record = json.loads(line)
            verdict = record.get("verdict") or {}
            timing = verdict.get("timing") or {}
            verdicts.append({"record": verdict or None, "task_id": record["task_id"], "sample": record["sample_id"],
                             "task_error": record.get("task_error"), "passed": verdict.get("passed"),
                             "failure": verdict.get("failure"), "gpu_s": verdict.get("gpu_s"),
                             "stage_s": dict(verdict.get("stage_s") or []), "median_ms": timing.get("median_ms"),
                             "stream_median_ms": timing.get("stream_median_ms"),
                             "idle_median_ms": timing.get("idle_median_ms"),
                             "past_stream_trials": timing.get("past_stream_trials"),
                             "speedup_vs_eager": verdict.get("speedup_vs_eager"),
                             "sol_fraction": verdict.get("sol_fraction"), "feedback": (verdict.get("feedback") or "")[:300]})
    result["verdicts"] = verdicts
    return result


def profile_one(name: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """`cutegen profile` (Nsight Compute, one forward) of a candidate file: the kernels' total duration."""
    level, problem = name.split("_")[1], name.split("_")[3]
    task_id = f"level{level}/{problem}"
    cmd = [sys.executable, "-m", "cutegen", "profile", str(args.candidates / f"{name}.py"), "--task", str(args.kernelbench),
           "--select", task_id, "--json", "--timeout", "170"]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=200)
    row: dict[str, Any] = {"candidate": name, "task_id": task_id, "status": done.returncode,
                           "wall_s": time.perf_counter() - started}
    try:
        profile = json.loads(done.stdout)["profile"]
        row["ncu_ms"] = profile["total_duration_s"] * 1e3
        row["kernels"] = len(profile["kernels"])
    except (ValueError, KeyError, TypeError):
        row["error"] = (done.stdout[-1000:] + done.stderr[-1500:])
    return row


def part(args: argparse.Namespace) -> dict[str, Any]:
    from cutegen.cli import env as cli_env
    from cutegen.manifest import machine_manifest

    args.out.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="cutegen-throughput-cache-"))
    env = {**os.environ, "CUTEGEN_CACHE": str(cache), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    if args.variants > 1:
        args.candidates = with_variants(args.candidates, args.variants, args.out / f"candidates-{args.part}")
    result = {"part": args.part, "select": args.select, "manifest": machine_manifest(cli_env.runtime_config()),
              "bench": run_bench(args, env), "profiles": []}
    by_name = {f"level_{v['task_id'][5:].replace('/', '_problem_')}_sample_{v['sample']}_kernel": v
               for v in result["bench"]["verdicts"]}
    for name in [n for n in (args.profile or "").split(",") if n]:
        row = profile_one(name, args, env)
        verdict = by_name.get(name)
        if verdict and row.get("ncu_ms") and verdict.get("median_ms"):
            row.update(evaluation_median_ms=verdict["median_ms"], stream_median_ms=verdict["stream_median_ms"],
                       idle_median_ms=verdict["idle_median_ms"], past_stream_trials=verdict["past_stream_trials"],
                       evaluation_over_ncu=verdict["median_ms"] / row["ncu_ms"])
        result["profiles"].append(row)
    (args.out / f"throughput-h200-{args.part}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def report(parts: list[dict[str, Any]], out: Path) -> str:
    """The merged table; the figures come from the package's own summary (bench.throughput_summary)
    over every part's verdicts, with the parts' wall times added up."""
    from cutegen.bench import throughput_summary
    from cutegen.journal import from_json
    from cutegen.records import Verdict

    verdicts = [v for p in parts for v in p["bench"]["verdicts"]]
    records = [from_json(Verdict, v["record"]) for v in verdicts if v.get("record")]
    # A part cut off by its budget wrote no throughput.json: its wall time is the bench command's.
    wall = sum((p["bench"]["throughput"] or {}).get("wall_s") or p["bench"]["wall_s"] for p in parts)
    lanes = max((p["bench"]["throughput"] or {}).get("lanes", 1) for p in parts)
    summary = throughput_summary(records, wall, lanes=lanes, build_jobs=max(
        (p["bench"]["throughput"] or {}).get("build_jobs", 1) for p in parts))
    tasks = sorted({v["task_id"] for v in verdicts}, key=lambda t: [int(p) if p.isdigit() else p for p in t.split("/")])
    after = {
        "evaluations": len(verdicts), "passed": sum(bool(v["passed"]) for v in verdicts), "tasks": len(tasks),
        "wall_s": round(wall, 1), "evaluations_per_gpu_minute": summary["per_gpu_minute"],
        "built_median_gpu_s": summary["built"]["median_gpu_s"], "built_p90_gpu_s": summary["built"]["p90_gpu_s"],
        "first_median_gpu_s": summary["first"]["median_gpu_s"],
        "first_median_reference_s": summary["first"]["median_reference_s"],
        "first_median_baselines_s": summary["first"]["median_baselines_s"],
        "median_gpu_s": summary["median_gpu_s"],
    }
    stages = summary["stage_median_s"]
    lines = ["# Full-size evaluation throughput on the H200", ""]
    manifest = parts[0]["manifest"] if parts else {}
    lines += [f"Machine: {manifest.get('gpu_name')}, driver {manifest.get('driver_version')}, torch"
              f" {manifest.get('torch_version')}, CUDA {manifest.get('cuda_runtime')}, nvcc {manifest.get('nvcc_version')},"
              f" CUTLASS {manifest.get('cutlass_version')}, {manifest.get('cpu_count')} CPU cores;"
              f" {manifest.get('timestamp_utc')}.", ""]
    lines += ["Commands (one device call per part):", ""] + [
        f"- `{p['bench']['command']}`" + (" (stopped by its time budget: the evaluations it finished are counted over its"
                                         f" {p['bench']['wall_s']:.0f} s)" if p['bench']['status'] == "timeout" else "")
        for p in parts] + [""]
    lines += ["| measure | before | after | goal |", "| --- | --- | --- | --- |",
              f"| evaluations per GPU-minute, builds included | {BEFORE['evaluations_per_gpu_minute']} |"
              f" {after['evaluations_per_gpu_minute']} ({after['evaluations']} evaluations, {after['wall_s']} s) | >= 4 |",
              f"| GPU s per evaluation of a built candidate, task's reference ready: median | - |"
              f" {after['built_median_gpu_s']} | <= 10 |",
              f"| same, 90th percentile | - | {after['built_p90_gpu_s']} | <= 20 |",
              f"| GPU s of a task's first evaluation (reference and baselines): median | - |"
              f" {after['first_median_gpu_s']} (reference {after['first_median_reference_s']}, baselines"
              f" {after['first_median_baselines_s']}) | <= 30 |",
              f"| seconds per evaluation, all: median | {BEFORE['median_s_per_evaluation']} |"
              f" {after['median_gpu_s']} (GPU-held) | |", "",
              f"Before: {BEFORE['source']}; its stage medians (max): "
              + ", ".join(f"{k} {BEFORE['stage_median_s'][k]} ({BEFORE['stage_max_s'][k]})" for k in BEFORE["stage_median_s"])
              + ". Not measured again on these candidates.", "",
              f"{after['passed']} of {after['evaluations']} evaluations passed, over {after['tasks']} tasks."
              + _not_accepted(verdicts), "",
              "Median seconds of each step over the evaluations that ran it (build_pool runs on the CPU, beside"
              " the GPU; every other step holds the GPU lane):", "",
              "| " + " | ".join(stages) + " |", "|" + " --- |" * len(stages),
              "| " + " | ".join(str(v) for v in stages.values()) + " |", ""]
    lines += ["| task | sample | passed | GPU s | reference s | baselines s | median ms | x eager | SOL |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in sorted(verdicts, key=lambda v: (tasks.index(v["task_id"]), v["sample"] or 0)):
        lines.append(f"| {v['task_id']} | {v['sample']} | {v['passed'] if v['task_error'] is None else 'task error'} |"
                     f" {v['gpu_s']} | {v['stage_s'].get('reference', '')} | {v['stage_s'].get('baselines', '')} |"
                     f" {_fmt(v['median_ms'])} | {_fmt(v['speedup_vs_eager'])} | {_fmt(v['sol_fraction'])} |")
    profiles = [r for p in parts for r in p["profiles"]]
    if profiles:
        lines += ["", "Nsight Compute (one forward, `cutegen profile`) against the full evaluation's medians:", "",
                  "| candidate | ncu ms | evaluation median ms | stream median | idle median | calls timed to idle | evaluation / ncu |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in profiles:
            lines.append(f"| {r['candidate']} | {_fmt(r.get('ncu_ms'))} | {_fmt(r.get('evaluation_median_ms'))} |"
                         f" {_fmt(r.get('stream_median_ms'))} | {_fmt(r.get('idle_median_ms'))} |"
                         f" {r.get('past_stream_trials')} | {_fmt(r.get('evaluation_over_ncu'))} |"
                         + (f" error: {r['error'][:120]!r}" if r.get("error") else ""))
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput-h200.md").write_text(text)
    (out / "throughput-h200.json").write_text(json.dumps({"before": BEFORE, "after": after, "stage_median_s": stages,
                                                          "parts": [p["part"] for p in parts]}, indent=1))
    return text


def _not_accepted(verdicts: list[dict[str, Any]]) -> str:
    """' Not accepted: N (why: count, ...).' for the verdicts that did not pass, or ''."""
    why = collections.Counter("task error" if v["task_error"] is not None else f"{v['failure']}"
                              for v in verdicts if not v["passed"])
    return f" Not accepted: {sum(why.values())} ({', '.join(f'{k}: {n}' for k, n in why.most_common())})." if why else ""


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kernelbench", type=Path)
    parser.add_argument("--select", default="level1:19-32")
    parser.add_argument("--part", default="part1")
    parser.add_argument("--budget-s", type=float, default=480.0, help="The bench's time limit (it resumes).")
    parser.add_argument("--profile", default="", help="Candidate file stems to profile after the bench.")
    parser.add_argument("--candidates", type=Path, default=CANDIDATES, help="The folder of candidate files.")
    parser.add_argument("--variants", type=int, default=1,
                        help="Samples per task made from each sample-0 file (see with_variants).")
    parser.add_argument("--extra", default="", help="More arguments for `cutegen bench` (e.g. --build-jobs 8).")
    parser.add_argument("--report-only", nargs="*", type=Path, help="Merge these parts' JSON into the report.")
    args = parser.parse_args()
    if args.report_only is not None:
        print(report([json.loads(p.read_text()) for p in args.report_only], args.out))
        return 0
    if args.kernelbench is None:
        parser.error("--kernelbench is required to run a part")
    result = part(args)
    print(report([result], args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
