"""The hardened evaluator on a GPU: cheats caught, honest kernels passed, faults survived, timing
fidelity and throughput.

    python3 bench/evaluator_h200.py --out DIR [--sections cheats,honest,faults,fidelity,throughput]

Sections (each bounded; results are written after every section, so a run cut short keeps what it did):
- cheats: every tests/fixtures/cheats/*.py (headers `# caught-by:`, `# task:`, `# backends:`) through
  evaluate_candidate on CUDA under each backend it applies to: expected check, actual failure, OK /
  NOT-OK. "OK (earlier: X)" means another check rejected it first.
- honest: tests/fixtures/honest/*.py and examples/candidates/*.py must pass under each of their
  backends (the cute and cuda ones timed, against eager and torch.compile); with --honest-rounds N,
  N times, each round in a new Evaluator (new reference processes: every seed drawn again).
- faults: tests/fixtures/faults/*.py for CUDA (kernel that never ends, illegal address, host segfault,
  device OOM, build that hangs): the failure named, and the next evaluation (in a fresh worker) passes.
- fidelity: examples/candidates/swish_scale_cute.py on 16384x4096 and 65536x4096 inputs, timed 5 times
  in one process by the evaluator's protocol function: spread of the medians; with ncu, the kernel's
  gpu__time_duration against the event-timed median.
- profiler_effect: whether a profiler session (what the kernel audit runs) slows the event-timed
  calls that follow it in the same process: the swish candidate at 256 x 4096 (a few microseconds)
  and 16384 x 4096, timed before and after two profiler sessions, with and without TEARDOWN_CUPTI=1
  (which makes Kineto detach CUPTI when a session ends); also the host time of one tiny launch. A
  third run times both right after `churn_free_memory` (which a worker runs just before timing) and
  3 s later: the ~10 us by which full evaluations exceed ncu's kernel time is not CUPTI.
- throughput: 16 distinct small CuTe candidates, built in parallel (CPU workers), then evaluated one
  after the other with timing: evaluations per GPU-minute, and the median seconds of each step.
Writes DIR/evaluator-h200.json and DIR/evaluator-h200.md with the machine manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

from _common import run_section  # noqa: E402 - bench/, this script's folder, is first on sys.path

from cutegen.config import EvalConfig  # noqa: E402
from cutegen.evaluate.pipeline import evaluate_candidate, prebuild_candidates  # noqa: E402
from cutegen.evaluate.service import Evaluator  # noqa: E402
from cutegen.tasks import load_task  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))  # the fixtures' header rules, shared with the tests
from fixture_headers import backends, header, task_path  # noqa: E402

TASKS = REPO / "examples" / "tasks"
FIXTURES = REPO / "tests" / "fixtures"
SWISH_CUTE = REPO / "examples" / "candidates" / "swish_scale_cute.py"
SECTIONS = ("cheats", "honest", "faults", "fidelity", "profiler_effect", "throughput")
# A check that works by making another one fire: churned memory shows up as NaN or wrong values.
EQUIVALENT = {"churn_free_memory": {"check_nonfinite", "compare_outputs", "determinism"}}


def task_for(name: str) -> Any:
    return load_task(TASKS / f"{name}.py")


def judge_row(path: Path, verdict: Any, expected: str | None, started: float, backend: str) -> dict[str, Any]:
    failed = {c.name for c in verdict.checks if not c.passed} | {
        f.check for c in verdict.checks if not c.passed for f in c.findings}
    if expected is None:
        status = "OK" if verdict.passed else "NOT-OK"
    elif verdict.passed:
        status = "NOT-OK"
    elif expected == verdict.failure or expected in failed or verdict.failure in EQUIVALENT.get(expected, ()):
        status = "OK"
    else:
        status = f"OK (earlier: {verdict.failure})"
    return {"fixture": str(path.relative_to(REPO)), "backend": backend, "expected": expected or "pass",
            "failure": verdict.failure,
            "stage": verdict.stage, "status": status, "s": round(time.perf_counter() - started, 2),
            "feedback": verdict.feedback[:400], "speedup_vs_eager": verdict.speedup_vs_eager,
            "speedup_vs_compile": verdict.speedup_vs_compile, "sol_fraction": verdict.sol_fraction,
            "median_ms": verdict.timing.median_ms if verdict.timing else None,
            "stage_s": dict(verdict.stage_s)}


def run_one(path: Path, config: EvalConfig, service: Evaluator, expected: str | None) -> dict[str, Any]:
    """One evaluation under `config.backend` (the caller picks it from the fixture's backends)."""
    started = time.perf_counter()
    try:
        task = load_task(task_path(path, REPO))
        verdict = evaluate_candidate(path, task, config, service)
    except Exception as err:  # noqa: BLE001 - a bench row, not a crash of the whole run
        return {"fixture": str(path.relative_to(REPO)), "backend": config.backend, "expected": expected or "pass",
                "failure": None, "status": "ERROR", "error": f"{type(err).__name__}: {err}"[:800]}
    return judge_row(path, verdict, expected, started, config.backend)


def run_many(jobs: list[tuple[Path, EvalConfig, str | None]], service: Evaluator) -> list[dict[str, Any]]:
    """The evaluations side by side: each builds in the service's CPU pool while others hold the GPU."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(service.lanes) + service.build_jobs) as pool:
        return list(pool.map(lambda job: run_one(job[0], job[1], service, job[2]), jobs))


def section_cheats(ctx: dict[str, Any]) -> dict[str, Any]:
    config = replace(ctx["config"], do_timing=False)
    rows = run_many([(p, replace(config, backend=backend), header(p).get("caught-by"))
                     for p in sorted((FIXTURES / "cheats").glob("*.py")) for backend in backends(p)], ctx["service"])
    return {"rows": rows, "ok": sum(r["status"].startswith("OK") for r in rows), "total": len(rows)}


def section_honest(ctx: dict[str, Any]) -> dict[str, Any]:
    timed = replace(ctx["config"], timing_trials=30)
    paths = sorted((FIXTURES / "honest").glob("*.py")) + sorted((REPO / "examples" / "candidates").glob("*.py"))
    jobs = [(p, replace(timed, backend=backend, do_timing=backend != "torch"), None)
            for p in paths for backend in backends(p)]
    rows = [dict(row, round=1) for row in run_many(jobs, ctx["service"])]
    for number in range(2, ctx["honest_rounds"] + 1):
        if time.perf_counter() - ctx["begun"] > ctx["budget_s"]:
            break
        with Evaluator("cuda") as fresh:  # new reference processes: the trials' seeds drawn again
            rows += [dict(row, round=number) for row in run_many(jobs, fresh)]
    return {"rows": rows, "ok": sum(r["status"] == "OK" for r in rows), "total": len(rows),
            "rounds": max(r["round"] for r in rows)}


def section_faults(ctx: dict[str, Any]) -> dict[str, Any]:
    config = replace(ctx["config"], do_timing=False, run_timeout_s=15.0, build_timeout_s=15.0)
    rows = []
    for path in sorted((FIXTURES / "faults").glob("*.py")):
        info = header(path)
        if info.get("device") not in ("cuda", "any"):
            continue
        row = run_one(path, replace(config, backend=backends(path)[0]), ctx["service"], info["fault"])
        after = run_one(SWISH_CUTE, config, ctx["service"], None)
        row["next_evaluation"] = after["status"]
        row["status"] = "OK" if row["status"] == "OK" and after["status"] == "OK" else "NOT-OK"
        rows.append(row)
    return {"rows": rows, "ok": sum(r["status"] == "OK" for r in rows), "total": len(rows)}


# Timing fidelity: one process builds the candidate once, then times it with the evaluator's protocol
# function (cutegen.evaluate.timing.time_forward) REPS times; a second process runs the same forward
# under Nsight Compute. Both on fresh randn inputs of ROWS x 4096 float32.
# The drivers' shared start: the swish candidate (argv[1]) built into the cache (argv[2]), as `model`.
LOAD_SWISH = r"""
import importlib.util, json, os, statistics, sys, time
from pathlib import Path
import torch
from cutegen.config import RuntimeConfig
from cutegen.evaluate.timing import time_forward
from cutegen.runtime import find_kernels

candidate, cache = sys.argv[1], Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("candidate", candidate)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for kernel in find_kernels(module):
    kernel.build(RuntimeConfig(cache_dir=cache))
model = module.ModelNew(1.5)
"""
FIDELITY_DRIVER = LOAD_SWISH + r"""
rows, reps, mode = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sets = [[torch.randn(rows, 4096, device="cuda")] for _ in range(3)]
if mode == "ncu":
    for _ in range(5):
        model(*sets[0])
    torch.cuda.synchronize()
    sys.exit(0)
runs = [time_forward(model, sets, device=torch.device("cuda"), trials=100, warmup=10) for _ in range(reps)]
print("RESULT " + json.dumps({
    "medians_ms": [statistics.median(r.times_ms) for r in runs],
    "stream_medians_ms": [statistics.median(r.stream_ms) for r in runs],
    "idle_medians_ms": [statistics.median(r.idle_ms) for r in runs],
    "past_stream": [r.past_stream for r in runs], "idle_limit_ms": [r.idle_limit_ms for r in runs]}))
"""
FIDELITY_ROWS = (16384, 65536)  # 0.27 and 1.07 GB per tensor: about 0.13 and 0.53 ms of DRAM traffic


def ncu_kernel_ms(driver: Path, args: list[str], env: dict[str, str]) -> dict[str, Any] | None:
    """Median gpu__time_duration of the candidate's kernel over the driver's 5 launches."""
    from cutegen.profile.run import find_tool

    ncu = find_tool(None, "ncu")
    if ncu is None:
        return None
    cmd = [ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv",
           sys.executable, str(driver), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=driver.parent)
    values = []
    for line in done.stdout.splitlines():
        cells = [c.strip('"') for c in line.split('","')]
        if len(cells) > 3 and "gpu__time_duration.sum" in line and "swish" in line:
            unit, value = cells[-2], float(cells[-1].replace(",", ""))
            values.append(value * {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit, 1e-6))
    if not values:
        return {"error": (done.stdout[-1500:] + done.stderr[-1500:])}
    return {"kernel_ms_median": statistics.median(values), "launches": len(values)}


def fidelity_case(driver: Path, cache: Path, rows: int, env: dict[str, str]) -> dict[str, Any]:
    args = [str(SWISH_CUTE), str(cache), str(rows)]
    done = subprocess.run([sys.executable, str(driver), *args, "5", "time"], capture_output=True, text=True,
                          timeout=240, env=env, cwd=driver.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"rows": rows, "error": (done.stdout[-1500:] + done.stderr[-1500:])}
    result: dict[str, Any] = {"rows": rows, **json.loads(lines[-1][len("RESULT "):])}
    medians = result["medians_ms"]
    result["spread_pct"] = (max(medians) - min(medians)) / min(medians) * 100
    result["median_ms"] = statistics.median(medians)
    result["bytes_per_s_tb"] = 2 * rows * 4096 * 4 / (result["median_ms"] * 1e-3) / 1e12
    try:
        result["ncu"] = ncu_kernel_ms(driver, [*args, "1", "ncu"], env)
    except Exception as err:  # noqa: BLE001
        result["ncu"] = {"error": f"{type(err).__name__}: {err}"}
    if result["ncu"] and "kernel_ms_median" in result["ncu"]:
        kernel_ms = result["ncu"]["kernel_ms_median"]
        result["event_over_ncu"] = result["median_ms"] / kernel_ms
        result["to_idle_over_ncu"] = statistics.median(result["idle_medians_ms"]) / kernel_ms
    return result


def section_fidelity(ctx: dict[str, Any]) -> dict[str, Any]:
    """Goal: medians of 5 timings in one run within 2%; event-timed median within 5% of ncu's kernel
    duration. "to idle" is start -> device idle after the device-wide synchronize (what the protocol
    reported before it took the end event on the stream when nothing outlasts it)."""
    workdir = Path(tempfile.mkdtemp(prefix="cutegen-fidelity-"))
    driver = workdir / "fidelity_driver.py"
    driver.write_text(FIDELITY_DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cases = [fidelity_case(driver, ctx["config"].runtime.cache_dir, rows, env) for rows in FIDELITY_ROWS]
    return {"cases": cases,
            "spread_ok": all(c.get("spread_pct", 100) <= 2.0 for c in cases),
            "ncu_within_5pct": [abs(c.get("event_over_ncu", 9) - 1) <= 0.05 for c in cases]}


PROFILER_DRIVER = LOAD_SWISH + r"""
from torch.profiler import ProfilerActivity, profile
sizes = {rows: [[torch.randn(rows, 4096, device="cuda")] for _ in range(3)] for rows in (256, 16384)}
tiny = torch.zeros(1, device="cuda")

def medians():
    out = {str(rows): statistics.median(time_forward(model, sets, device=torch.device("cuda"), trials=200,
                                                     warmup=20).times_ms) for rows, sets in sizes.items()}
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(2000):
        tiny.add_(1)
    out["launch_us"] = (time.perf_counter() - started) / 2000 * 1e6
    torch.cuda.synchronize()
    return out

result = {"teardown_cupti": os.environ.get("TEARDOWN_CUPTI"), "before": medians(), "sessions": []}
if sys.argv[3] == "churn":  # what a candidate's timing follows in a worker: the NaN fill of free memory
    from cutegen.evaluate.checks_dynamic import churn_free_memory

    churn_free_memory(torch.device("cuda"))
    result["after_churn"] = medians()
    time.sleep(3.0)
    result["after_churn_3s"] = medians()
for _ in range(2):
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        model(*sizes[256][0])
        torch.cuda.synchronize()
    result["sessions"].append({"profile_s": time.perf_counter() - started, "after": medians()})
print("RESULT " + json.dumps(result))
"""


def section_profiler_effect(ctx: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="cutegen-cupti-"))
    driver = workdir / "profiler_driver.py"
    driver.write_text(PROFILER_DRIVER)
    runs = []
    for teardown, churn in ((None, "-"), ("1", "-"), ("1", "churn")):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        env.pop("TEARDOWN_CUPTI", None)
        if teardown:
            env["TEARDOWN_CUPTI"] = teardown
        done = subprocess.run([sys.executable, str(driver), str(SWISH_CUTE), str(ctx["config"].runtime.cache_dir), churn],
                              capture_output=True, text=True, timeout=200, env=env, cwd=workdir)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        runs.append(json.loads(lines[-1][len("RESULT "):]) if lines
                    else {"teardown_cupti": teardown, "error": (done.stdout[-1500:] + done.stderr[-1500:])})
    for run in runs:  # microseconds a call gained after the first and second profiler sessions
        if "before" in run:
            run["added_us"] = [{key: round((session["after"][key] - run["before"][key]) * (1 if key == "launch_us"
                                                                                          else 1e3), 2)
                                for key in run["before"]} for session in run["sessions"]]
    return {"runs": runs}


def stage_medians(verdicts: list[Any]) -> dict[str, float]:
    """Median wall seconds of each evaluation step (Verdict.stage_s) over the verdicts."""
    steps: dict[str, list[float]] = {}
    for verdict in verdicts:
        for step, seconds in verdict.stage_s:
            steps.setdefault(step, []).append(seconds)
    return {step: round(statistics.median(values), 3) for step, values in steps.items()}


def section_throughput(ctx: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="cutegen-throughput-"))
    source = SWISH_CUTE.read_text()
    paths = []
    for k in range(16):  # distinct sources (hence distinct builds), same kernel
        path = workdir / f"swish_variant_{k:02d}.py"
        path.write_text(source.replace("#include <cstdint>", f"// variant {k}\n#include <cstdint>", 1))
        paths.append(path)
    config = replace(ctx["config"], compile_baseline=False)
    jobs = max(1, min(8, (os.cpu_count() or 2) // 2))
    started = time.perf_counter()
    built = prebuild_candidates(paths, config, jobs=jobs)
    build_wall = time.perf_counter() - started
    task = task_for("swish_scale")
    evaluate_candidate(SWISH_CUTE, task, config, ctx["service"])  # baselines measured and cached first
    started = time.perf_counter()
    verdicts = [evaluate_candidate(p, task, config, ctx["service"]) for p in paths]
    eval_wall = time.perf_counter() - started
    return {"candidates": len(paths), "build_jobs": jobs, "build_wall_s": build_wall,
            "builds_ok": sum(b["ok"] for b in built), "build_errors": [b for b in built if not b["ok"]][:3],
            "eval_wall_s": eval_wall, "passed": sum(v.passed for v in verdicts),
            "evaluations_per_gpu_minute": len(paths) / (eval_wall / 60.0),
            "gpu_s_median": statistics.median(v.gpu_s or 0.0 for v in verdicts),
            "stage_s_median": stage_medians(verdicts),
            "cached_builds_in_eval": sum("cached" in c.detail for v in verdicts for c in v.checks if c.name == "build")}


def round_note(row: dict[str, Any]) -> str:
    return f" (round {row['round']})" if row.get("round", 1) > 1 else ""


def write_report(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluator-h200.json").write_text(json.dumps(results, indent=1, default=str))
    lines = ["# Evaluator on the GPU", "", f"device: {results['manifest'].get('gpu', results['manifest'])}", ""]
    for name, data in results["sections"].items():
        lines.append(f"## {name} ({data.get('wall_s', 0):.0f} s)")
        if "error" in data:
            lines += ["", "```", data["error"][-2000:], "```", ""]
            continue
        if "rows" in data:
            lines += ["", f"{data['ok']}/{data['total']} OK", "", "| fixture | backend | expected | failure | status |",
                      "|---|---|---|---|---|"]
            lines += [f"| {Path(r['fixture']).name}{round_note(r)}"
                      f" | {r.get('backend', '-')} | {r['expected']} | {r.get('failure')}"
                      f" | {r['status']} |" for r in data["rows"]]
        else:
            lines += ["", "```", json.dumps({k: v for k, v in data.items() if k != "verdicts"}, indent=1,
                                            default=str)[:3000], "```"]
        lines.append("")
    (out / "evaluator-h200.md").write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="Start no further section once this many seconds have passed.")
    parser.add_argument("--cache", type=Path, default=None, help="Evaluation cache (default: a fresh temp dir).")
    parser.add_argument("--honest-rounds", type=int, default=1,
                        help="Evaluate the honest candidates this many times, each round with new seeds"
                        " (a round starts only within --budget-s).")
    parser.add_argument("--no-compile-baseline", dest="compile_baseline", action="store_false",
                        help="Time eager only: no verdict depends on torch.compile's time, which costs ~25 s of"
                        " compiling per task (the speedups vs torch.compile are then missing).")
    args = parser.parse_args()
    from cutegen.cli import env
    from cutegen.manifest import machine_manifest

    begun = time.perf_counter()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="cutegen-bench-eval-"))
    runtime = replace(env.runtime_config(), cache_dir=cache / "build")
    results: dict[str, Any] = {"manifest": machine_manifest(runtime), "sections": {}}
    with Evaluator("cuda") as service:
        config = EvalConfig(device="cuda", cache_dir=cache / "eval", runtime=runtime, run_timeout_s=120.0,
                            compile_baseline=args.compile_baseline)
        ctx = {"service": service, "config": service.with_arch(config),  # builds and evaluations share keys
               "honest_rounds": args.honest_rounds, "begun": begun, "budget_s": args.budget_s}
        for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
            if time.perf_counter() - begun > args.budget_s:
                results["sections"][name] = {"error": f"skipped: the {args.budget_s:g} s budget was spent"}
                continue
            data = run_section(name, globals(), ctx, results, lambda r: write_report(args.out, r))
            done = f"{data['ok']}/{data['total']}" if "total" in data else "error" if "error" in data else "done"
            per_minute = f", {data['evaluations_per_gpu_minute']:.2f} per GPU-minute" \
                if "evaluations_per_gpu_minute" in data else ""
            print(f"{name}: {done}{per_minute} in {data['wall_s']:.0f} s", flush=True)
    return 0 if all("error" not in d for d in results["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
