"""A beam search over three example tasks on the GPU, through the CLI as a user runs it, the model
replaced by RECORDED replies written by hand (examples/replays/beam3_torch.jsonl: hand-written
PyTorch-op modules, test data and not a model's output; one proposal with wrong results and one that
fails to import, each repaired once). What this checks is the search and the evaluator judging a
round's candidates side by side on one GPU, not a model:

    cutegen bench examples/tasks --select swish_scale,row_softmax,layer_norm --model replay:... \\
        --search beam:2,3 --rounds 2 --repairs 1 --backend torch --device cuda
    cutegen report RUN --out DIR

Every recorded reply is served once, in order; each task gets 3 proposals in round 1 and 6 in round 2
with at least two evaluations in flight at once; each ends with a correct kernel; the report has its
search trees and the budget plot. Writes beam-gpu/ in the results folder: the report, the run's
report.md, the CLI's log and beam-gpu.{json,md} (per task and round: proposals, repairs, candidates
evaluated, most in flight, passed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from results_table import ResultsTable

REPO = Path(__file__).resolve().parents[1]
REPLAY = "examples/replays/beam3_torch.jsonl"
TASKS = ("swish_scale", "row_softmax", "layer_norm")
EXPECTED_PROPOSALS = {1: 3, 2: 6}  # beam:2,3: 3 from the generation, then 3 from each of the 2 kept
RUN_ID = "beam"


def _cutegen(args: list[str], log: Path, timeout_s: float) -> int | str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}
    with open(log, "w", encoding="utf-8") as out:
        out.write("$ cutegen " + " ".join(args) + "\n")
        out.flush()
        try:
            return subprocess.run([sys.executable, "-m", "cutegen", *args], cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return "timeout"


@pytest.fixture(scope="module")
def beam(tmp_path_factory, results_dir) -> dict[str, Any]:
    """The bench and its report, run once; the run directory and the results folder."""
    runs, out = tmp_path_factory.mktemp("beam-runs"), results_dir / "beam-gpu"
    out.mkdir(parents=True, exist_ok=True)
    bench = ["bench", "examples/tasks", "--select", ",".join(TASKS), "--model", f"replay:{REPLAY}", "--search", "beam:2,3",
             "--rounds", "2", "--repairs", "1", "--generations", "1", "--profiling", "none",
             # every recorded reply is for both rounds: no stop at speed of light (small inputs sit in L2)
             "--target-sol", "10", "--backend", "torch", "--device", "cuda", "--timing-trials", "100",
             "--no-compile-baseline", "--runs-dir", str(runs), "--run-id", RUN_ID]
    status = {"bench": _cutegen(bench, out / "bench-log.txt", 400)}
    status["report"] = _cutegen(["report", str(runs / RUN_ID), "--out", str(out)], out / "report-log.txt", 120)
    if (runs / RUN_ID / "report.md").is_file():
        shutil.copyfile(runs / RUN_ID / "report.md", out / "run-report.md")
    return {"run": runs / RUN_ID, "out": out, "status": status}


def _records(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def rounds(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """Per task and round: proposals, repairs, candidates evaluated, passed, and the most evaluations in
    flight at once (started and not yet finished, in the journal's order)."""
    steps = [r for r in records if r["kind"] == "step"]
    round_of = {s["eval_key"]: (s["task_id"], s["round"]) for s in steps if s.get("eval_key")}
    in_flight: dict[str, set[str]] = {}
    most: dict[tuple[str, int], int] = {}
    for r in records:
        if r["kind"] == "evaluate" and r["eval_key"] in round_of:
            in_flight.setdefault(r["task_id"], set()).add(r["eval_key"])
            key = round_of[r["eval_key"]]
            most[key] = max(most.get(key, 0), len(in_flight[r["task_id"]]))
        elif r["kind"] == "step" and r.get("eval_key"):
            in_flight.get(r["task_id"], set()).discard(r["eval_key"])
    evaluated = {r["eval_key"] for r in records if r["kind"] == "evaluate"}
    found: dict[str, dict[str, dict[str, int]]] = {}
    for s in steps:
        these = [t for t in steps if t["task_id"] == s["task_id"] and t["round"] == s["round"]]
        found.setdefault(s["task_id"], {})[str(s["round"])] = {
            "proposals": sum(t["stage"] in ("generate", "optimize") for t in these),
            "repairs": sum(t["stage"].startswith("repair") for t in these),
            "evaluated": len({t["eval_key"] for t in these if t.get("eval_key") in evaluated}),
            "passed": sum(bool(t.get("verdict") and t["verdict"].get("passed")) for t in these),
            "most_in_flight": most.get((s["task_id"], s["round"]), 0)}
    return found


@pytest.fixture(scope="module")
def table(beam) -> ResultsTable:
    found = rounds(_records(beam["run"], "journal.jsonl"))
    table = ResultsTable(beam["out"], "beam-gpu", "Beam search over three tasks (beam:2,3, 2 rounds, backend torch)",
                         ["task", "round", "proposals", "repairs", "evaluated", "most_in_flight", "passed"],
                         note="**The replies are hand-written recorded test data (examples/replays/beam3_torch.jsonl),"
                              " not a model's output.** Round 0 is the generation.")
    summary = json.loads((beam["run"] / "summary.json").read_text()) if (beam["run"] / "summary.json").is_file() else {}
    table.set("status", beam["status"])
    table.set("best", {t["task_id"]: {k: t.get(k) for k in ("speedup_vs_eager", "best_median_ms", "sol_fraction",
                                                           "llm_calls", "gpu_s", "stop_reason")}
                       for t in summary.get("tasks", [])})
    for task, by_round in found.items():
        for number, counts in sorted(by_round.items()):
            table.add({"task": task, "round": number, **counts})
    return table


@pytest.mark.gpu
def test_the_bench_and_its_report_exit_0(beam, table):
    assert beam["status"] == {"bench": 0, "report": 0}, (beam["out"] / "bench-log.txt").read_text()[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_every_recorded_reply_is_served_once_in_order(task, beam, table):
    recorded = [json.loads(line)["stage"] for line in (REPO / REPLAY).read_text().splitlines()[1:]
                if json.loads(line)["task"] == task]
    served = [(r["seq"], r["stage"]) for r in _records(beam["run"], "replay_served.jsonl") if r["task"] == task]
    assert [stage for _, stage in served] == recorded and [seq for seq, _ in served] == list(range(len(served)))


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_each_round_judges_its_proposals_side_by_side(task, beam, table):
    found = {int(row["round"]): row for row in table.rows if row["task"] == task}
    assert {n: found.get(n, {}).get("proposals") for n in EXPECTED_PROPOSALS} == EXPECTED_PROPOSALS
    assert all(found[n]["most_in_flight"] >= 2 for n in EXPECTED_PROPOSALS), found
    assert table.extra["best"][task]["speedup_vs_eager"] is not None  # a correct kernel at the end


@pytest.mark.gpu
def test_the_report_has_the_search_trees_and_the_budget_plot(beam, table):
    text = (beam["out"] / "bench-report.md").read_text() if (beam["out"] / "bench-report.md").is_file() else ""
    assert "## Search trees" in text and "](plots/budget.svg)" in text and (beam["out"] / "plots" / "budget.svg").is_file()


def test_the_round_counts_come_from_the_journal_order():
    """rounds() on a hand-made journal: two evaluations started before either step ended are in flight
    together; a third started after one ended is not counted above two."""
    def step(key, stage, passed):
        return {"kind": "step", "task_id": "t", "round": 1, "eval_key": key, "stage": stage, "verdict": {"passed": passed}}

    records = [{"kind": "evaluate", "task_id": "t", "eval_key": "a"}, {"kind": "evaluate", "task_id": "t", "eval_key": "b"},
               step("a", "optimize", True), {"kind": "evaluate", "task_id": "t", "eval_key": "c"},
               step("b", "optimize", False), step("c", "repair_correctness", True)]
    assert rounds(records) == {"t": {"1": {"proposals": 2, "repairs": 1, "evaluated": 3, "passed": 2, "most_in_flight": 2}}}
