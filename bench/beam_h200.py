"""A beam search over three example tasks on the GPU, several candidates judged side by side per round,
the model replaced by RECORDED replies written by hand.

    python3 bench/beam_h200.py --out DIR [--device cuda|cpu] [--runs-dir DIR] [--timing-trials N]
                               [--compile-baseline] [--budget-s S]

Runs the CLI as a user would (`python3 -m cutegen bench examples/tasks --select
swish_scale,row_softmax,layer_norm --model replay:examples/replays/beam3_torch.jsonl --search beam:2,3
--rounds 2 --repairs 1 --backend torch --device cuda ...`), then `python3 -m cutegen report` on the run.
The replies (examples/replays/beam3_torch.jsonl) are hand-written PyTorch-op modules, recorded test data
and not a model's output: per task a generation, round 1 (one directions call, 3 proposals side by side)
and round 2 (a directions call for each of the 2 kernels kept, 6 proposals side by side), one proposal
with wrong results and one that fails to import, each repaired once. What this measures is the search
and the evaluator judging a round's candidates together on one GPU, not a model.

Writes into --out: bench-report.md, bench-report.html and plots/ (from `cutegen report`), run-report.md
(the run's own report.md), bench-log.txt (the CLI's output), beam-h200.md (machine, command, per task
the candidates evaluated per round, how many were in flight at once, the best speedup) and
beam-h200.json (the same, with checks). Paths of the machine are written as $OUT and $RUNS. Exits 0
when every check passed, 1 otherwise, 2 when `--device cuda` finds no CUDA device.

`--device cpu` runs the same on the CPU with cheaper evaluation settings (2 correctness trials, 10 timed
calls), to test this script; torch.compile is left out of the baselines unless --compile-baseline (its
compilation of three tasks would take much of the step's 240 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from _common import check_lines, shown

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

REPLAY = "examples/replays/beam3_torch.jsonl"  # relative to the repository: the command names no local path
TASKS = ("swish_scale", "row_softmax", "layer_norm")
SEARCH, ROUNDS, REPAIRS = "beam:2,3", 2, 1
RUN_ID = "beam-h200"
# What beam:2,3 over 2 rounds asks of each task: 3 proposals from the generation, then 3 from each of the
# 2 kernels kept (round 1 always keeps a second one: every task has a passing round-1 proposal).
EXPECTED_PROPOSALS = {1: 3, 2: 6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--runs-dir", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--timing-trials", type=int, default=None, help="default: 100 on cuda, 10 on cpu")
    parser.add_argument("--compile-baseline", action="store_true", help="also time torch.compile (slow)")
    parser.add_argument("--budget-s", type=float, default=210.0, help="limit of the bench command, seconds")
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs_dir = (args.runs_dir or Path(tempfile.mkdtemp(prefix="cutegen-beam-"))).resolve()
    result: dict[str, Any] = {
        "bench": "beam_h200", "replies": "recorded test data, hand-written: not a model's output",
        "replay_file": REPLAY, "search": SEARCH, "rounds": ROUNDS, "repairs": REPAIRS, "tasks": {}, "checks": [],
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    status = 1
    try:
        result["manifest"] = _manifest()
        status = _run(args, result)
    except Exception as err:  # one shot on the GPU machine: keep whatever was learned
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = _shown(traceback.format_exc(), args)
    finally:
        _write(args, result)
    return status


def _shown(text: str, args: argparse.Namespace) -> str:
    return shown(text, REPO, {args.out: "$OUT", args.runs_dir: "$RUNS"})


def _manifest() -> dict[str, Any]:
    from cutegen.cli import env
    from cutegen.manifest import machine_manifest

    return machine_manifest(env.runtime_config())


def bench_command(args: argparse.Namespace) -> list[str]:
    """The `cutegen bench` command line, as a user would type it (from the repository root)."""
    cpu = args.device == "cpu"
    trials = args.timing_trials or (10 if cpu else 100)
    return [sys.executable, "-m", "cutegen", "bench", "examples/tasks", "--select", ",".join(TASKS),
            "--model", f"replay:{REPLAY}", "--search", SEARCH, "--rounds", str(ROUNDS), "--repairs", str(REPAIRS),
            "--generations", "1", "--profiling", "none",
            # The replies are recorded for both rounds: a stop at speed of light (small inputs that sit in
            # L2 can pass the DRAM bound) would leave some unread.
            "--target-sol", "10",
            "--backend", "torch", "--device", args.device, "--timing-trials", str(trials),
            *(["--correctness-trials", "2"] if cpu else []),
            "--compile-baseline" if args.compile_baseline else "--no-compile-baseline",
            "--runs-dir", str(args.runs_dir), "--run-id", RUN_ID]


def _run(args: argparse.Namespace, result: dict[str, Any]) -> int:
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            result["error"] = "no CUDA device: run with --device cpu, or on the GPU machine"
            return 2
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}
    run_dir = args.runs_dir / RUN_ID
    cmd = bench_command(args)
    result["command"] = _shown(" ".join(cmd), args)
    result["bench"] = _call(cmd, args, env, args.out / "bench-log.txt", args.budget_s)
    report_cmd = [sys.executable, "-m", "cutegen", "report", str(run_dir), "--out", str(args.out)]
    result["report_command"] = _shown(" ".join(report_cmd), args)
    result["report"] = _call(report_cmd, args, env, args.out / "report-log.txt", 120)
    if (run_dir / "report.md").is_file():
        shutil.copyfile(run_dir / "report.md", args.out / "run-report.md")
    _summarise(run_dir, result)
    _checks(run_dir, args.out, result)
    return 0 if result["checks"] and all(c["passed"] for c in result["checks"]) else 1


def _call(cmd: list[str], args: argparse.Namespace, env: dict[str, str], log_path: Path, limit_s: float) -> dict:
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            status: Any = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    log_path.write_text(_shown(log_path.read_text(encoding="utf-8"), args), encoding="utf-8")
    return {"status": status, "wall_s": round(time.perf_counter() - started, 1)}


def _journal(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _summarise(run_dir: Path, result: dict[str, Any]) -> None:
    """Per task and round: proposals, repairs, candidates evaluated, how many evaluations were in flight
    at once (started and not yet finished, from the journal's order), passed; then the best kernel."""
    records = _journal(run_dir)
    steps = [r for r in records if r["kind"] == "step"]
    round_of = {s["eval_key"]: (s["task_id"], s["round"]) for s in steps if s.get("eval_key")}
    in_flight: dict[str, set[str]] = {}
    most: dict[tuple[str, int], int] = {}
    everywhere = 0
    for r in records:
        if r["kind"] == "evaluate" and r["eval_key"] in round_of:
            flying = in_flight.setdefault(r["task_id"], set())
            flying.add(r["eval_key"])
            key = round_of[r["eval_key"]]
            most[key] = max(most.get(key, 0), len(flying))
            everywhere = max(everywhere, sum(len(v) for v in in_flight.values()))
        elif r["kind"] == "step" and r.get("eval_key"):
            in_flight.get(r["task_id"], set()).discard(r["eval_key"])
    result["most_in_flight_run"] = everywhere
    evaluated = {r["eval_key"] for r in records if r["kind"] == "evaluate"}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    best = {t["task_id"]: t for t in summary.get("tasks", [])}
    result["totals"] = summary.get("totals")
    for task in TASKS:
        mine = [s for s in steps if s["task_id"] == task]
        rounds = {}
        for number in sorted({s["round"] for s in mine}):
            these = [s for s in mine if s["round"] == number]
            rounds[str(number)] = {
                "proposals": sum(s["stage"] in ("generate", "optimize") for s in these),
                "repairs": sum(s["stage"].startswith("repair") for s in these),
                "evaluated": len({s["eval_key"] for s in these if s.get("eval_key") in evaluated}),
                "passed": sum(bool(s.get("verdict") and s["verdict"].get("passed")) for s in these),
                "most_in_flight": most.get((task, number), 0),
            }
        b = best.get(task, {})
        result["tasks"][task] = {
            "rounds": rounds, "steps": len(mine), "llm_calls": b.get("llm_calls"),
            "speedup_vs_eager": b.get("speedup_vs_eager"), "speedup_vs_compile": b.get("speedup_vs_compile"),
            "best_median_ms": b.get("best_median_ms"), "sol_fraction": b.get("sol_fraction"),
            "stop_reason": b.get("stop_reason"), "gpu_s": b.get("gpu_s")}


def _check(result: dict[str, Any], name: str, passed: bool, detail: str) -> None:
    result["checks"].append({"name": name, "passed": bool(passed), "detail": detail})


def _checks(run_dir: Path, out: Path, result: dict[str, Any]) -> None:
    _check(result, "bench_exit_0", result["bench"]["status"] == 0, f"status {result['bench']['status']}")
    # Every recorded reply asked for once, in the order and at the stage it was recorded for.
    recorded: dict[str, list[str]] = {}
    for line in (REPO / REPLAY).read_text().splitlines()[1:]:
        entry = json.loads(line)
        recorded.setdefault(entry["task"], []).append(entry["stage"])
    log = run_dir / "replay_served.jsonl"
    served: dict[str, list[tuple[int, str]]] = {}
    for line in (log.read_text().splitlines() if log.is_file() else []):
        entry = json.loads(line)
        served.setdefault(entry["task"], []).append((entry["seq"], entry["stage"]))
    for task in TASKS:
        got = served.get(task, [])
        _check(result, f"replies_in_order_{task}", [s for _, s in got] == recorded.get(task)
               and [q for q, _ in got] == list(range(len(got))), f"{len(got)} of {len(recorded.get(task, []))} served")
        rounds = result["tasks"][task]["rounds"]
        counts = {n: rounds.get(str(n), {}).get("proposals") for n in EXPECTED_PROPOSALS}
        _check(result, f"side_by_side_{task}", counts == EXPECTED_PROPOSALS
               and all(rounds[str(n)]["most_in_flight"] >= 2 for n in EXPECTED_PROPOSALS if str(n) in rounds),
               f"proposals per round {counts}, at most in flight "
               f"{ {n: r['most_in_flight'] for n, r in rounds.items()} }")
        _check(result, f"correct_{task}", result["tasks"][task]["speedup_vs_eager"] is not None,
               str(result["tasks"][task]["stop_reason"]))
    report = out / "bench-report.md"
    text = report.read_text() if report.is_file() else ""
    _check(result, "report_has_trees_and_budget_plot", result["report"]["status"] == 0 and "## Search trees" in text
           and "](plots/budget.svg)" in text and (out / "plots" / "budget.svg").is_file(),
           f"status {result['report']['status']}, bench-report.md {'written' if text else 'missing'}")


def _fmt(value: Any, digits: int = 3, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}g}{suffix}"


def _write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    (args.out / "beam-h200.json").write_text(json.dumps(result, indent=1, default=str))
    m = result.get("manifest") or {}
    lines = [f"# Beam search over three tasks (beam:2,3, 2 rounds, backend torch, device {args.device})", "",
             "**The replies are hand-written recorded test data (examples/replays/beam3_torch.jsonl), not a"
             " model's output:** this measures the search and the evaluator judging several candidates of a"
             " round side by side, not what a model achieves.", "",
             f"Machine: {m.get('gpu_name') or 'no GPU'}, driver {m.get('driver_version')}, CUDA"
             f" {m.get('cuda_runtime')}, torch {m.get('torch_version')}, {m.get('cpu_count')} CPU cores;"
             f" {m.get('timestamp_utc') or result.get('started_utc')}.", ""]
    if result.get("command"):
        bench = result.get("bench") or {}
        lines += ["Command (from the repository root), then `" + result.get("report_command", "") + "`:", "",
                  f"    {result['command']}", "",
                  f"Exit status {bench.get('status')}, {bench.get('wall_s')} s wall; at most"
                  f" {result.get('most_in_flight_run')} evaluations in flight at once over the run.", ""]
    if result["tasks"]:
        lines += ["| task | round | proposals | repairs | candidates evaluated | most in flight | passed |",
                  "|---|---|---|---|---|---|---|"]
        for task, data in result["tasks"].items():
            for number, r in data["rounds"].items():
                lines.append(f"| {task} | {number} | {r['proposals']} | {r['repairs']} | {r['evaluated']} |"
                             f" {r['most_in_flight']} | {r['passed']} |")
        lines += ["", "Round 0 is the generation.", "",
                  "| task | best vs eager | best vs torch.compile | best median ms | SOL | model calls | GPU s |"
                  " stopped |", "|---|---|---|---|---|---|---|---|"]
        for task, d in result["tasks"].items():
            lines.append(f"| {task} | {_fmt(d['speedup_vs_eager'], suffix='x')} |"
                         f" {_fmt(d['speedup_vs_compile'], suffix='x')} | {_fmt(d['best_median_ms'], 4)} |"
                         f" {_fmt(d['sol_fraction'], 2)} | {d['llm_calls']} | {_fmt(d['gpu_s'], 3)} |"
                         f" {d['stop_reason']} |")
    lines += check_lines(result)
    lines += ["", "The search trees, the trajectories and the best speedup against budget (model calls and GPU"
              " seconds) are in bench-report.md / bench-report.html."]
    (args.out / "beam-h200.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
