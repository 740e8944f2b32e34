"""`cutegen optimize` / `cutegen resume` as a user runs them: kill and resume, split execution."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutegen.journal import Journal
from cutegen.llm import request_sha256
from cutegen.records import Message, Request

from helpers import needs_nvcc

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "swish_scale.py"
REPLAY = REPO / "examples" / "replays" / "swish_scale_torch.jsonl"
FAST_EVAL = ["--backend", "torch", "--device", "cpu", "--correctness-trials", "2", "--timing-trials", "10",
             "--no-compile-baseline"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory, shared_build_cache) -> Path:
    # Shared by the runs here: the reference probe and the baselines are measured once. Builds go to the
    # run's shared build cache (test_agent_replays.py compiles the same replies' kernels).
    root = tmp_path_factory.mktemp("cache")
    (root / "build").symlink_to(shared_build_cache, target_is_directory=True)
    return root


def cutegen(args: list[str], tmp_path: Path, cache: Path, **env_over: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTEGEN_", "ANTHROPIC_", "OPENAI_"))}
    env.update(CUTEGEN_CACHE=str(cache), PYTHONUNBUFFERED="1", **env_over)
    return subprocess.Popen([sys.executable, "-m", "cutegen", *args], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def recorded(index: int) -> str:
    return json.loads(REPLAY.read_text().splitlines()[index + 1])["text"]


def test_sigkill_mid_run_then_resume_repeats_no_call_and_no_evaluation(tmp_path, cache):
    args = ["optimize", str(TASK), "--model", f"replay:{REPLAY}", "--rounds", "2", "--repairs", "1",
            "--profiling", "delayed:1", "--runs-dir", "runs", "--run-id", "r1", *FAST_EVAL]
    # Each replayed reply waits 3 s first, so a kill just after a step lands inside a model call.
    process = cutegen(args, tmp_path, cache, CUTEGEN_REPLAY_DELAY_S="3")
    journal_path = tmp_path / "runs" / "r1" / "journal.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        text = journal_path.read_text() if journal_path.exists() else ""
        if text.count('"kind": "step"') >= 2:
            break
        time.sleep(0.2)
    assert process.poll() is None, finish(process)[1]
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = Journal.open(tmp_path / "runs" / "r1")
    assert len(before.of_kind("step")) == 2 and not before.of_kind("task_end")

    code, out = finish(cutegen(["resume", "runs/r1"], tmp_path, cache))
    assert code == 0, out
    after = Journal.open(tmp_path / "runs" / "r1")
    assert [s.stage for s in after.steps()] == ["generate", "repair_build", "optimize", "optimize"]
    assert after.records[: len(before.records)] == before.records  # append-only
    served = [json.loads(line) for line in (tmp_path / "runs" / "r1" / "replay_served.jsonl").read_text().splitlines()]
    assert sorted(s["seq"] for s in served) == [0, 1, 2, 3]  # each recorded reply served exactly once
    assert len(after.of_kind("reply")) == 4
    started = [r["eval_key"] for r in after.of_kind("evaluate")]
    assert len(started) == len(set(started)) == 4  # no evaluation ran twice
    assert (tmp_path / "runs" / "r1" / "best" / "swish_scale.py").is_file()
    assert "not a live model's output" in (tmp_path / "runs" / "r1" / "report.md").read_text()


def pending_request(run: Path) -> dict:
    requests = [json.loads(p.read_text()) for p in sorted((run / "exchange").glob("*.request.json"))]
    waiting = [r for r in requests if not (run / "exchange" / r["reply_file"]).exists()]
    assert len(waiting) == 1
    return waiting[0]


def test_exchange_waits_for_reply_files_and_the_run_can_move(tmp_path, cache):
    args = ["optimize", str(TASK), "--model", "exchange:", "--rounds", "0", "--repairs", "1",
            "--runs-dir", "runs", "--run-id", "x1", *FAST_EVAL]
    code, out = finish(cutegen(args, tmp_path, cache))
    assert code == 75, out
    assert "waiting for replies" in out
    run = tmp_path / "runs" / "x1"
    first = pending_request(run)
    assert first["stage"] == "generate" and first["task_id"] == "swish_scale"
    rebuilt = Request(tuple(Message(**m) for m in first["messages"]), first["max_tokens"], first["task_id"],
                      first["stage"], first["seq"])
    assert request_sha256(rebuilt, "exchange") == first["request_sha256"]
    (run / "exchange" / first["reply_file"]).write_text(recorded(0))  # fails to import

    code, out = finish(cutegen(["resume", "runs/x1"], tmp_path, cache))
    assert code == 75, out
    second = pending_request(run)
    assert second["stage"] == "repair_build" and second["seq"] == 1
    (run / "exchange" / second["reply_file"]).write_text(recorded(1))

    shutil.move(str(run), str(tmp_path / "elsewhere"))  # a run directory is portable
    code, out = finish(cutegen(["resume", "elsewhere"], tmp_path, cache))
    assert code == 0, out
    journal = Journal.open(tmp_path / "elsewhere")
    assert [(s.stage, s.verdict.passed) for s in journal.steps()] == [("generate", False), ("repair_build", True)]
    assert len(journal.of_kind("evaluate")) == 2 and [r["status"] for r in journal.of_kind("exit")] == [75, 75, 0]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the exit of a machine without a GPU")
def test_needs_gpu_status_and_help(tmp_path, cache):
    args = ["optimize", str(TASK), "--model", f"replay:{REPLAY}", "--backend", "torch", "--device", "cuda",
            "--runs-dir", "runs", "--run-id", "g1"]
    code, out = finish(cutegen(args, tmp_path, cache))
    assert code == 76, out
    assert "needs a GPU" in out
    code, out = finish(cutegen(["optimize", "--help"], tmp_path, cache))
    assert code == 0 and "75" in out and "76" in out


@needs_nvcc
def test_split_execution_builds_and_repairs_without_a_gpu_and_stops_only_for_a_built_candidate(tmp_path, cache):
    """On a machine with nvcc and no GPU (the architecture named), the CuTe replies' first kernel fails
    to compile: that is judged here, the repair is asked for and built, and only then the run stops
    with 76, the built candidate waiting for a GPU. The log gets one line per finished step."""
    pytest.importorskip("cutlass_library")
    replay = REPO / "examples" / "replays" / "swish_scale_cute.jsonl"
    args = ["optimize", str(TASK), "--model", f"replay:{replay}", "--backend", "cute", "--device", "cuda",
            "--runs-dir", "runs", "--run-id", "split"]
    code, out = finish(cutegen(args, tmp_path, cache, CUTEGEN_ARCH="sm_90a", CUDA_VISIBLE_DEVICES=""), timeout=400)
    assert code == 76, out
    journal = Journal.open(tmp_path / "runs" / "split")
    (first,) = journal.steps("swish_scale")
    assert first.stage == "generate" and first.verdict.failure == "build_error" and first.verdict.gpu_s is None
    assert "sigmoidf" in first.verdict.feedback and "build_pool" in dict(first.verdict.stage_s)
    replies = journal.of_kind("reply")
    assert [r["stage"] for r in replies] == ["generate", "repair_build"]  # the repair was asked and built
    assert not journal.of_kind("evaluate")  # no evaluation of the built repair started
    assert "swish_scale generate: failed at build: build_error" in out  # the log line of the finished step


@needs_nvcc
def test_split_execution_under_the_cuda_backend_repairs_a_plain_cuda_build_error(tmp_path, cache):
    """The same split execution with --backend cuda and the plain-CUDA replies: the first kernel's
    launch does not compile (the most vexing parse of a dim3), that verdict is reached here, the
    repair prompt carries the plain-CUDA contract and the pitfall of that error, and the repaired
    kernel is built; then the run stops with 76."""
    replay = REPO / "examples" / "replays" / "swish_scale_cuda.jsonl"
    args = ["optimize", str(TASK), "--model", f"replay:{replay}", "--backend", "cuda", "--device", "cuda",
            "--runs-dir", "runs", "--run-id", "split-cuda"]
    code, out = finish(cutegen(args, tmp_path, cache, CUTEGEN_ARCH="sm_90a", CUDA_VISIBLE_DEVICES=""), timeout=400)
    assert code == 76, out
    run = tmp_path / "runs" / "split-cuda"
    journal = Journal.open(run)
    assert journal.of_kind("run")[0]["evaluation"]["backend"] == "cuda"
    (first,) = journal.steps("swish_scale")
    assert first.stage == "generate" and first.verdict.failure == "build_error" and first.verdict.gpu_s is None
    assert first.verdict.backend == "cuda" and 'declares a function named `grid`' in first.verdict.feedback
    replies = journal.of_kind("reply")
    assert [r["stage"] for r in replies] == ["generate", "repair_build"]  # the repair was asked and built
    assert not journal.of_kind("evaluate")  # no evaluation of the built repair started
    repair_prompt = json.loads((run / replies[1]["prompt_path"]).read_text())
    system, user = (m["content"] for m in repair_prompt)
    assert "plain CUDA C++" in system and "CuTe" not in system
    assert "### Most vexing parse of a dim3" in user and "do not use CuTe" in user and "cute::" not in user
    assert "swish_scale generate: failed at build: build_error" in out
    assert "needs a GPU" in out


def test_missing_key_fails_before_a_run_directory_exists(tmp_path, cache):
    code, out = finish(cutegen(["optimize", str(TASK), "--model", "anthropic:claude-sonnet-4-5", "--runs-dir", "runs"],
                               tmp_path, cache))
    assert code == 2 and "ANTHROPIC_API_KEY" in out
    assert not (tmp_path / "runs").exists()
