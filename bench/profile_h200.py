"""Nsight Compute profiles of the example candidates on a GPU, checked against the evaluator.

    python3 bench/profile_h200.py --out DIR

For three example candidates at sizes where launch overhead is small (elementwise swish and row
softmax on a 16384 x 4096 float32 tensor, a 512 x 512 x 2048 fp32 GEMM) and one two-kernel forward (softmax
then swish, for a real multi-kernel report):
1. the evaluator judges the candidate (fp32 track, 1e-4) and times it (event-timed median);
2. `cutegen profile`'s machinery (cutegen.profile.collect + interpret) profiles one forward; its wall
   time must stay under 60 s;
3. DRAM throughput from ncu (DRAM bytes / kernel duration) is compared with the evaluator's
   (the task's minimum bytes / event-timed median): they should agree within 15%;
4. the instruction mix (static SASS) and ncu's executed FFMA count of the GEMM are checked against
   a SIMT GEMM (FFMA only, M*N*K FFMAs, no HMMA/HGMMA);
5. `ncu --query-metrics` says which of the extra metrics this ncu has (names saved for next time),
   and the `cutegen profile` command runs once end to end.
Writes into DIR (7 files, no subfolders): profile-h200.json and .md (with the machine manifest),
ncu_<case>.csv (ncu's raw page of each report: tests/fixtures/ncu/ fixtures) and
ncu_query_metrics.txt. Every case is guarded on its own, and results are written after each one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

from cutegen.config import EvalConfig, ProfileConfig  # noqa: E402
from cutegen.records import to_json  # noqa: E402

EXAMPLES = REPO / "examples"
AGREEMENT_PCT = 15.0
PROFILE_WALL_S = 60.0
# M, N, K of the GEMM. ncu counts DRAM traffic during the kernel only, and the part of the output
# still in the L2 (50 MB) when the kernel ends is written back after it: a 2048^3 GEMM showed 36 MB
# of DRAM traffic for its 48 MB minimum, and 512 x 512 x 2048 (1 MB of output) 8.4 MB for 9 MB with
# no write counted. K must stay short too: cuBLAS splits a long K over CTAs, whose partial sums are
# more accurate than the SIMT kernel's one in-order sum per element, and on heavy-tailed inputs
# the fp32 track rejected that kernel at 1024 x 1024 x 8192 (471 of 1M elements) and at 512 x 512 x
# 2048 (203 of 262144) as farther from the float64 result than torch.matmul. 12288 x 12288 x 128:
# 576 MB of output for 12 MB of operands, so what stays in the L2 is under 8% of the minimum bytes.
GEMM_SHAPE = (12288, 12288, 128)
# Task files at profiling sizes: (example task, text to replace, replacement).
LARGE = {
    "swish_scale": ("batch_size = 256", "batch_size = 16384"),
    "row_softmax": ("rows = 256", "rows = 16384"),
    "matmul": ("M, N, K = 512, 384, 256", "M, N, K = %d, %d, %d" % GEMM_SHAPE),
}
# A forward of two of the examples' kernels (softmax, then swish), for a recorded multi-kernel report.
TWO_KERNELS = '''
import importlib.util
import torch.nn as nn


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_softmax = _load({softmax!r}, "example_row_softmax")
_swish = _load({swish!r}, "example_swish_scale")
softmax_kernel = _softmax.kernel
swish_kernel = _swish.kernel


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax = _softmax.ModelNew()
        self.swish = _swish.ModelNew(1.5)

    def forward(self, x):
        return self.swish(self.softmax(x))
'''


def write_tasks(folder: Path) -> dict[str, Path]:
    paths = {}
    for name, (old, new) in LARGE.items():
        text = (EXAMPLES / "tasks" / f"{name}.py").read_text()
        if old not in text:
            raise RuntimeError(f"examples/tasks/{name}.py no longer contains {old!r}: update LARGE")
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text.replace(old, new))
    return paths


def cases(folder: Path, tasks: dict[str, Path]) -> list[dict[str, Any]]:
    two = folder / "softmax_then_swish_cute.py"
    two.write_text(TWO_KERNELS.format(softmax=str(EXAMPLES / "candidates" / "row_softmax_cute.py"),
                                      swish=str(EXAMPLES / "candidates" / "swish_scale_cute.py")))
    return [
        {"name": "swish_scale", "candidate": EXAMPLES / "candidates" / "swish_scale_cute.py",
         "task": tasks["swish_scale"], "evaluate": True},
        {"name": "row_softmax", "candidate": EXAMPLES / "candidates" / "row_softmax_cute.py",
         "task": tasks["row_softmax"], "evaluate": True},
        {"name": "matmul", "candidate": EXAMPLES / "candidates" / "matmul_cute.py", "task": tasks["matmul"],
         "evaluate": True},
        {"name": "softmax_then_swish", "candidate": two, "task": tasks["row_softmax"], "evaluate": False},
    ]


# ------------------------------------------------------------------------------------- metric names


def query_metrics(out: Path, ncu: str | None) -> dict[str, Any]:
    """Which extra metrics this ncu lists; the names (and the suffixes of ours) saved for next time."""
    from cutegen.profile.metrics import EXTRA_METRICS, UNLISTED_PREFIXES, base_name, parse_query_metrics

    if ncu is None:
        return {"error": "ncu not found"}
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    listed = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    names = sorted(parse_query_metrics(listed.stdout))
    bases = sorted({base_name(m) for m in EXTRA_METRICS if not m.startswith(UNLISTED_PREFIXES)})
    suffix = subprocess.run([ncu, "--query-metrics", "--query-metrics-mode", "suffix", "--metrics", ",".join(bases)],
                            capture_output=True, text=True, timeout=120)
    (out / "ncu_query_metrics.txt").write_text(
        f"# {version.splitlines()[-1] if version else 'ncu'}\n# `ncu --query-metrics` (names only), exit"
        f" {listed.returncode}\n" + "\n".join(names) + f"\n\n# `ncu --query-metrics --query-metrics-mode suffix"
        f" --metrics <bases of cutegen.profile.metrics.EXTRA_METRICS>`, exit {suffix.returncode}\n"
        + suffix.stdout + suffix.stderr[-3000:])
    available = {m: (m.startswith(UNLISTED_PREFIXES) or base_name(m) in names) for m in EXTRA_METRICS}
    return {"version": version, "listed_count": len(names), "query_returncode": listed.returncode,
            "query_stderr": listed.stderr[-1000:], "extra_metrics_listed": available,
            "extra_metrics_not_listed": [m for m, ok in available.items() if not ok]}


# ------------------------------------------------------------------------------------------ one case


def evaluate(case: dict[str, Any], config: EvalConfig, service: Any) -> dict[str, Any]:
    from cutegen.evaluate.pipeline import evaluate_candidate
    from cutegen.tasks import load_task

    started = time.perf_counter()
    verdict = evaluate_candidate(case["candidate"], load_task(case["task"]), config, service)
    errors = verdict.errors
    return {"passed": verdict.passed, "failure": verdict.failure, "feedback": verdict.feedback[:600],
            "median_ms": verdict.timing.median_ms if verdict.timing else None,
            "speedup_vs_eager": verdict.speedup_vs_eager, "sol_fraction": verdict.sol_fraction,
            "max_abs_error": errors.max_abs_error if errors else None,
            "max_rel_error": errors.max_rel_error if errors else None, "wall_s": time.perf_counter() - started,
            "stage_s": dict(verdict.stage_s)}


def profile(case: dict[str, Any], config: ProfileConfig, eval_config: EvalConfig, out: Path) -> dict[str, Any]:
    from cutegen.profile import ProfileUnavailable, collect, interpret, profile_text
    from cutegen.tasks import load_task

    task = load_task(case["task"])
    source = Path(case["candidate"]).read_text()
    started = time.perf_counter()
    try:
        collected = collect(source, task, config, eval_config)
    except ProfileUnavailable as err:
        return {"error": f"{err.reason}: {err}"[:2000], "log_tail": err.log_tail[-3000:],
                "wall_s": time.perf_counter() - started}
    (out / f"ncu_{case['name']}.csv").write_text(collected.csv_text)
    result = interpret(collected, source, task, config, eval_config)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "ncu_s": collected.ncu_s, "under_60_s": wall < PROFILE_WALL_S,
            "sections_only": collected.sections_only, "metrics_missing": list(collected.metrics_missing),
            "csv_columns": collected.csv_text.splitlines()[0].count(",") + 1 if collected.csv_text else 0,
            "summary": profile_text(result), "profile": to_json(result), "_record": result}


def agreement(case: dict[str, Any], judged: dict[str, Any] | None, profiled: dict[str, Any]) -> dict[str, Any]:
    """ncu's DRAM throughput against the task's minimum bytes over the evaluator's event-timed median."""
    from cutegen.tasks import load_task
    from cutegen.trace import trace_task

    record = profiled.get("_record")
    if record is None or not judged or not judged.get("median_ms"):
        return {}
    min_bytes = trace_task(load_task(case["task"])).min_bytes
    event = min_bytes / (judged["median_ms"] * 1e-3) if min_bytes else None
    ncu = record.dram_bytes_per_s
    row: dict[str, Any] = {"min_bytes": min_bytes, "event_bytes_per_s": event, "ncu_dram_bytes_per_s": ncu,
                           "ncu_dram_bytes": record.total_dram_bytes, "ncu_duration_s": record.total_duration_s}
    if event and ncu:
        row["agreement_pct"] = 100.0 * (ncu - event) / event
        row["within_15_pct"] = abs(row["agreement_pct"]) <= AGREEMENT_PCT
        row["ncu_bytes_over_min_bytes"] = record.total_dram_bytes / min_bytes
        row["event_time_over_ncu_time"] = judged["median_ms"] * 1e-3 / record.total_duration_s
    return row


def gemm_mix_check(profiled: dict[str, Any]) -> dict[str, Any]:
    """The SIMT GEMM's mix: FFMA only in the code, M*N*K FFMAs executed, an idle tensor pipe."""
    record = profiled.get("_record")
    if record is None:
        return {}
    mixes = record.instruction_mix
    executed = record.kernels[0].ffma_thread_instructions if record.kernels else None
    expected = GEMM_SHAPE[0] * GEMM_SHAPE[1] * GEMM_SHAPE[2]
    static_ok = bool(mixes) and all(m.ffma > 0 and m.tensor_core == 0 for m in mixes)
    return {"static": [{"function": m.function, "ffma": m.ffma, "hmma": m.hmma, "hgmma": m.hgmma,
                        "cp_async": m.cp_async} for m in mixes],
            "executed_ffma": executed, "expected_ffma": expected,
            "executed_over_expected": executed / expected if executed else None,
            "tensor_pipe_pct": record.kernels[0].tensor_pipe_pct if record.kernels else None,
            "ffma_only_flagged": any("FFMA only" in f for f in record.findings),
            "reported_correctly": static_ok and executed is not None and abs(executed / expected - 1) < 0.01}


def cli_check(candidate: Path, task: Path, cache: Path) -> dict[str, Any]:
    """`cutegen profile --json` once, end to end, on the shared build cache."""
    env = {**os.environ, "CUTEGEN_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cutegen", "profile", str(candidate), "--task", str(task), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    row: dict[str, Any] = {"returncode": done.returncode, "wall_s": time.perf_counter() - started,
                           "stderr_tail": done.stderr[-1500:]}
    try:
        row["summary"] = json.loads(done.stdout)["summary"]
    except (ValueError, KeyError, TypeError):
        row["stdout_tail"] = done.stdout[-1500:]
    return row


# ------------------------------------------------------------------------------------------ report


def write_report(out: Path, results: dict[str, Any]) -> None:
    clean = dict(results)
    clean["cases"] = [{k: ({kk: vv for kk, vv in v.items() if kk != "_record"} if isinstance(v, dict) else v)
                       for k, v in case.items()} for case in results["cases"]]
    (out / "profile-h200.json").write_text(json.dumps(clean, indent=1, default=str))
    m = results["manifest"]
    ncu_version = (results.get("ncu", {}).get("version") or "ncu ?").splitlines()[-1]
    lines = ["# Nsight Compute profiles on the GPU", "",
             f"{m.get('gpu_name')}, driver {m.get('driver_version')}, CUDA {m.get('cuda_runtime')}, torch"
             f" {m.get('torch_version')}, nvcc {m.get('nvcc_version')}, CUTLASS {m.get('cutlass_version')},"
             f" {ncu_version}, {m.get('timestamp_utc')}.", "",
             "Evaluator GB/s: the task's minimum bytes over the event-timed median; ncu: DRAM bytes over kernel"
             " time. Event/ncu time: the evaluator's median over ncu's summed kernel durations.", "",
             "| case | correct at 1e-4 | median ms (events) | evaluator GB/s | ncu DRAM GB/s | agreement |"
             " event/ncu time | profile wall s | diagnosis | SOL | kernels |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in results["cases"]:
        judged, prof, agree = case.get("evaluation") or {}, case.get("profile") or {}, case.get("agreement") or {}
        record = prof.get("_record")
        gbps = lambda v: f"{v / 1e9:.0f}" if v else "-"  # noqa: E731
        lines.append(
            f"| {case['name']} | {judged.get('passed', '-')} | {judged.get('median_ms') or '-'} |"
            f" {gbps(agree.get('event_bytes_per_s'))} | {gbps(agree.get('ncu_dram_bytes_per_s'))} |"
            f" {'%+.1f%%' % agree['agreement_pct'] if 'agreement_pct' in agree else '-'} |"
            f" {'%.3f' % agree['event_time_over_ncu_time'] if 'event_time_over_ncu_time' in agree else '-'} |"
            f" {prof.get('wall_s', 0):.1f} | {record.diagnosis if record else prof.get('error', '-')[:60]} |"
            f" {'%.0f%%' % (100 * record.sol_fraction) if record and record.sol_fraction else '-'} |"
            f" {len(record.kernels) if record else '-'} |")
    for case in results["cases"]:
        if "gemm_mix" in case:
            lines += ["", f"GEMM instruction mix: `{json.dumps(case['gemm_mix'], default=str)}`"]
    for case in results["cases"]:
        summary = (case.get("profile") or {}).get("summary")
        if summary:
            lines += ["", f"## {case['name']}", "", "```", summary, "```"]
    if "cli" in results:
        lines += ["", f"`cutegen profile --json`: exit {results['cli'].get('returncode')} in"
                      f" {results['cli'].get('wall_s', 0):.1f} s"]
    missing = results.get("ncu", {}).get("extra_metrics_not_listed")
    if missing is not None:
        lines += ["", f"Extra metrics this ncu does not list ({len(missing)}): " + (", ".join(missing) or "none")]
    (out / "profile-h200.md").write_text("\n".join(lines) + "\n")


def run_case(case: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"name": case["name"], "candidate": str(Path(case["candidate"]).name)}
    started = time.perf_counter()
    try:
        if case["evaluate"]:
            row["evaluation"] = evaluate(case, ctx["eval_config"], ctx["service"])
        row["profile"] = profile(case, ctx["profile_config"], ctx["eval_config"], ctx["out"])
        row["agreement"] = agreement(case, row.get("evaluation"), row["profile"])
        if case["name"] == "matmul":
            row["gemm_mix"] = gemm_mix_check(row["profile"])
    except Exception:  # noqa: BLE001 - one case must not lose the others
        row["error"] = traceback.format_exc()[-3000:]
    row["wall_s"] = time.perf_counter() - started
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=None, help="Cache root (default: a fresh temp dir).")
    parser.add_argument("--cases", default=None, help="Comma-separated case names (default: all).")
    parser.add_argument("--no-cli", action="store_true", help="Skip the end-to-end `cutegen profile` check.")
    args = parser.parse_args()
    from cutegen.cli import env
    from cutegen.evaluate.pipeline import prebuild_candidates
    from cutegen.evaluate.service import Evaluator
    from cutegen.manifest import machine_manifest
    from cutegen.profile.run import find_tool

    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="cutegen-bench-profile-"))
    folder = Path(tempfile.mkdtemp(prefix="cutegen-profile-tasks-"))
    runtime = replace(env.runtime_config(), cache_dir=cache / "build")
    results: dict[str, Any] = {"manifest": machine_manifest(runtime), "cases": []}
    try:
        results["ncu"] = query_metrics(args.out, find_tool(None, "ncu"))
    except Exception:  # noqa: BLE001
        results["ncu"] = {"error": traceback.format_exc()[-2000:]}
    write_report(args.out, results)
    todo = cases(folder, write_tasks(folder))
    if args.cases:
        wanted = {name.strip() for name in args.cases.split(",")}
        todo = [case for case in todo if case["name"] in wanted]
    with Evaluator("cuda") as service:
        eval_config = EvalConfig(device="cuda", cache_dir=cache / "eval", runtime=runtime, correctness_trials=2,
                                 weight_seeds=1, timing_trials=50, compile_baseline=False, run_timeout_s=150.0)
        # the device's arch, so prebuilds, evaluations and profiles share builds
        eval_config = service.with_arch(eval_config)
        started = time.perf_counter()
        results["prebuild"] = prebuild_candidates([c["candidate"] for c in todo if c["evaluate"]], eval_config, jobs=3)
        results["prebuild_wall_s"] = time.perf_counter() - started
        ctx = {"service": service, "eval_config": eval_config, "out": args.out,
               "profile_config": ProfileConfig(timeout_s=150.0)}
        for case in todo:
            results["cases"].append(run_case(case, ctx))
            write_report(args.out, results)
            print(f"{case['name']}: {results['cases'][-1]['wall_s']:.0f} s", flush=True)
    if not args.no_cli and time.perf_counter() - began < 200:  # the end-to-end check is the first thing to drop
        try:
            results["cli"] = cli_check(todo[0]["candidate"], todo[0]["task"], cache)
        except Exception:  # noqa: BLE001
            results["cli"] = {"error": traceback.format_exc()[-2000:]}
    results["wall_s"] = time.perf_counter() - began
    write_report(args.out, results)
    return 0 if all("error" not in c and "error" not in (c.get("profile") or {}) for c in results["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
