"""`cutegen bench` as a user runs it, on CPU with the torch backend: the agent over the example tasks
with recorded replies (tests/fixtures/bench_replay_torch.jsonl), resumed; existing candidate files
judged with --evaluate; and the report of both side by side, opened in headless Chromium."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_report_html import render_in_chromium

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
REPLAY = REPO / "tests" / "fixtures" / "bench_replay_torch.jsonl"
HONEST = REPO / "tests" / "fixtures" / "honest"
# The six tasks the recorded replies answer (examples/tasks may hold more).
SIX = ["--select", "conv2d,layer_norm,linear_gelu,matmul,row_softmax,swish_scale"]
FAST_EVAL = [*SIX, "--backend", "torch", "--device", "cpu", "--correctness-trials", "1", "--timing-trials", "5",
             "--no-compile-baseline"]
AGENT = ["--rounds", "1", "--repairs", "1", "--generations", "1", "--profiling", "immediate"]


def cutegen(args: list[str], cwd: Path, timeout: float = 400) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTEGEN_", "ANTHROPIC_", "OPENAI_"))}
    env = {k: v for k, v in env.items() if k != "COLUMNS"}  # a log's width: rich's default, 80
    env.update(CUTEGEN_CACHE=str(cwd / "cache"), PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "cutegen", *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return done.returncode, done.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def agent_run(work) -> tuple[Path, str]:
    code, out = cutegen(["bench", str(TASKS), "--model", f"replay:{REPLAY}", *AGENT, *FAST_EVAL,
                         "--budget-tokens", "100000000", "--runs-dir", "runs", "--run-id", "b1"], work)
    assert code == 0, out
    return work / "runs" / "b1", out


@pytest.fixture(scope="module")
def evaluate_run(work) -> tuple[Path, str]:
    folder = work / "candidates"
    folder.mkdir()
    shutil.copy(HONEST / "swish_scale.py", folder / "swish_scale.py")
    shutil.copy(HONEST / "matmul.py", folder / "matmul_sample_1.py")
    (folder / "row_softmax.py").write_text(_module("x", "e = x.exp()\n        return e / e.sum()"))  # whole-tensor sum
    (folder / "matmul.py").write_text(_module("A, B", "raise RuntimeError('kernel launch failed')"))
    (folder / "notes.py").write_text("# not a candidate of any task\n")
    code, out = cutegen(["bench", str(TASKS), "--evaluate", str(folder), *FAST_EVAL, "--runs-dir", "runs",
                         "--run-id", "e1"], work)
    assert code == 0, out
    return work / "runs" / "e1", out


def _module(args: str, body: str) -> str:
    return ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
            f"        super().__init__()\n\n    def forward(self, {args}):\n        {body}\n")


def test_replay_bench_writes_kernelbench_results_markdown_and_html(agent_run):
    run, out = agent_run
    data = json.loads((run / "results.json").read_text())
    assert data["kind"] == "agent" and data["recorded"] is True and data["model"] == "replay:replay.jsonl"
    assert data["agent"]["budget"]["tokens"] == 100_000_000  # --budget-tokens reaches the run's AgentConfig
    assert data["tolerance"] == {"track": "fp32", "atol": 1e-4, "rtol": 1e-4, "half_atol": 2e-2, "half_rtol": 2e-2}
    assert data["manifest"]["torch_version"] and "gpu_count" in data["manifest"]
    assert len(data["tasks_sha256"]) == 64
    results = {r["task_id"]: r for r in data["results"]}
    assert sorted(results) == ["conv2d", "layer_norm", "linear_gelu", "matmul", "row_softmax", "swish_scale"]
    for r in results.values():  # KernelBench's fields, and ours
        assert r["compiled"] and r["correctness"] and r["status"] == "done" and r["stage_reached"] == "passed"
        assert r["runtime"] > 0 and r["ref_runtime"] > 0 and r["speedup_vs_eager"] > 0
        assert r["llm_calls"] == len(r["trajectory"]) and r["cost_usd"] == 0.0 and r["gpu_s"] > 0
        assert r["speedup_vs_eager"] == pytest.approx(r["eager_median_ms"] / r["median_ms"])
    trajectory = [(p["stage"], p["passed"], p["profile_shown"]) for p in results["row_softmax"]["trajectory"]]
    assert trajectory == [("generate", False, False), ("repair_correctness", True, False), ("optimize", True, True)]
    assert [p["outcome"] for p in results["matmul"]["trajectory"]] == ["failed at build: import_error", "passed", "passed"]
    assert results["row_softmax"]["trajectory"][0]["outcome"] == "failed at correctness: compare_outputs"
    summary = {g["group"]: g for g in data["summary"]}
    assert list(summary) == ["all", "clean"] and summary["all"]["correct"] == 6 and summary["all"]["fast_0"] == 1.0
    speedups = sorted(r["speedup_vs_eager"] for r in results.values())
    assert summary["all"]["fast_1_eager"] == pytest.approx(sum(s > 1 for s in speedups) / 6)
    assert summary["all"]["geomean_speedup_eager"] == pytest.approx(math.prod(speedups) ** (1 / 6))
    report = (run / "bench-report.md").read_text()
    for task in results:
        assert f"| {task} | b1 | torch | correct |" in report  # each row names the run's backend
    assert (run / "bench-report.html").is_file() and (run / "report.md").is_file()  # ours beside the agent's
    assert "6/6 done" in out and "results:" in out
    # stdout is a pipe, as in a log: one plain line per event (time, task, step, verdict, speedups, GPU
    # seconds; then each task's stop), no table, nothing wrapped at 80 columns.
    assert not any(box in out for box in "┃━│┏└")
    steps = [line for line in out.splitlines() if re.match(r"\d\d:\d\d:\d\d \S+ (generate|repair_\w+|optimize)", line)]
    assert len(steps) == sum(len(r["trajectory"]) for r in results.values())
    assert all(" | GPU " in line and " | s: " in line for line in steps) and max(map(len, steps)) > 80
    assert any("passed, median" in line and "x eager PyTorch" in line for line in steps)
    ends = [line for line in out.splitlines() if re.match(r"\d\d:\d\d:\d\d \S+ done: ", line)]
    assert sorted(line.split()[1] for line in ends) == sorted(results)
    assert all("optimization round(s) done | best kernel: median" in line for line in ends)


def test_replay_bench_report_renders_in_chromium(agent_run):
    run, _ = agent_run
    page = render_in_chromium(run / "bench-report.html")
    assert page["problems"] == [] and page["external"] == []
    labels = [p["label"] for p in page["plots"]]
    # no speed of light on a CPU
    assert labels[:4] == ["Speedup per task", "fast_p curve", "Cost per task", "Best speedup against budget"]
    assert len(labels) == 4 + 6  # a trajectory per task
    assert all(p["width"] > 200 and p["height"] > 100 for p in page["plots"])
    assert "No fractions of the reference algorithm's work bound" in page["text"]


def test_rerunning_the_bench_resumes_without_new_calls_or_evaluations(agent_run, work):
    run, _ = agent_run
    served = (run / "replay_served.jsonl").read_text().count("\n")
    evaluations = (run / "journal.jsonl").read_text().count('"kind": "evaluate"')
    code, out = cutegen(["bench", str(TASKS), "--model", f"replay:{REPLAY}", *AGENT, *FAST_EVAL,
                         "--runs-dir", "runs", "--run-id", "b1", "--no-report"], work)
    assert code == 0, out
    assert "resuming" in out
    assert (run / "replay_served.jsonl").read_text().count("\n") == served
    assert (run / "journal.jsonl").read_text().count('"kind": "evaluate"') == evaluations
    assert len(json.loads((run / "bench.json").read_text())["sessions"]) == 2
    code, out = cutegen(["bench", str(TASKS), "--select", "matmul,swish_scale", "--model", f"replay:{REPLAY}",
                         "--runs-dir", "runs", "--run-id", "b1"], work)
    assert code == 2 and "another task set" in out


def test_evaluate_judges_candidate_files_with_their_verdicts(evaluate_run, work):
    run, out = evaluate_run
    assert "notes.py" in out  # a file that names no task is reported, not judged
    data = json.loads((run / "results.json").read_text())
    assert data["kind"] == "evaluate"
    got = {(r["task_id"], r["sample_id"]): (r["correctness"], r["stage_reached"], r["failure"]) for r in data["results"]}
    assert got[("swish_scale", 0)] == (True, "passed", None)
    assert got[("matmul", 1)] == (True, "passed", None)
    assert got[("row_softmax", 0)][:2] == (False, "correctness")
    assert got[("matmul", 0)][:2] == (False, "correctness")
    for task in ("conv2d", "layer_norm", "linear_gelu"):
        assert got[(task, None)] == (False, "missing", None)
    all_ = data["summary"][0]
    assert (all_["tasks"], all_["correct"]) == (6, 1)  # matmul counts by its sample 0, which failed
    lines = (run / "verdicts.jsonl").read_text().count("\n")
    assert lines == 4
    # Not a terminal: one line per verdict, and the session's throughput
    assert "swish_scale sample 0: passed" in out and "row_softmax sample 0: failed at correctness" in out
    throughput = json.loads((run / "throughput.json").read_text())
    assert throughput["evaluations"] == 4 and "throughput: 4 evaluations" in out
    code, out = cutegen(["bench", str(TASKS), "--evaluate", str(work / "candidates"), *FAST_EVAL,
                         "--runs-dir", "runs", "--run-id", "e1", "--no-report"], work)
    assert code == 0, out
    assert (run / "verdicts.jsonl").read_text().count("\n") == lines  # nothing judged twice


def test_report_puts_runs_side_by_side(agent_run, evaluate_run, work):
    code, out = cutegen(["report", "runs/b1", "runs/e1", "--out", "compare"], work)
    assert code == 0, out
    text = (work / "compare" / "bench-report.md").read_text()
    assert "| swish_scale | b1 (" in text and "| swish_scale | e1 (" in text  # labels name what differs
    page = render_in_chromium(work / "compare" / "bench-report.html")
    assert page["problems"] == []
    assert "Further samples" in page["text"]  # matmul's sample 1 is listed apart from the summary
