"""The run journal: durable appends, torn lines, content-addressed files, caches, portable setup."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cutegen.config import AgentConfig, Budget, EvalConfig, RuntimeConfig
from cutegen.errors import ConfigError
from cutegen.journal import SCHEMA_VERSION, Journal, eval_key, load_run, start_run
from cutegen.records import CheckResult, ErrorStats, Finding, Reply, Step, TimingStats, Verdict, from_json, to_json
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
VERDICT = Verdict(
    task_id="t", candidate_sha256="c" * 64, track="fp32", backend="torch", passed=False, stage="anticheat",
    failure="check_forward_allowlist", feedback="forward calls torch.matmul",
    checks=(CheckResult("check_forward_allowlist", "static", False, "bad",
                        (Finding("check_forward_allowlist", "m", 3),)),),
    errors=ErrorStats(1e-3, 2e-3, 1e-4, 5, 100, 1e-4, 1e-4), timing=TimingStats(1.0, 1.1, 0.9, 0.05, 10),
    speedup_vs_eager=1.25, gpu_s=3.5,
)


def test_records_round_trip_through_json():
    assert from_json(Verdict, json.loads(json.dumps(to_json(VERDICT)))) == VERDICT
    step = Step(task_id="t", index=0, stage="generate", round=0, request_sha256="r", prompt_path="prompts/p.json",
                reply_path="replies/r.md", candidate_sha256=None, candidate_path=None, bad_reply="no code",
                verdict=VERDICT, eval_key="k", profile_shown=False)
    assert from_json(Step, json.loads(json.dumps(to_json(step)))) == step
    config = AgentConfig(budget=Budget(usd=1.5), knowledge_dir=Path("/k"))
    assert from_json(AgentConfig, to_json(config)) == config


def test_appends_are_lines_with_schema_version_and_survive_a_torn_tail(tmp_path):
    journal = Journal.create(tmp_path / "run")
    journal.append("session", note="first")
    journal.append("reply", request_sha256="abc", task_id="t", reply={"cost_usd": 0.5})
    with open(journal.path, "a") as handle:  # a kill in the middle of a write
        handle.write('{"schema_version": 1, "kind": "step", "task_')
    reopened = Journal.open(tmp_path / "run")
    assert [r["kind"] for r in reopened.records] == ["session", "reply"]
    assert all(r["schema_version"] == SCHEMA_VERSION for r in reopened.records)
    reopened.append("exit", status=0)
    lines = reopened.path.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["session", "reply", "exit"]
    assert reopened.reply("abc")["reply"]["cost_usd"] == 0.5 and reopened.reply("zzz") is None


def test_newer_schema_and_missing_journal_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a cutegen run directory"):
        Journal.open(tmp_path)
    (tmp_path / "journal.jsonl").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "kind": "run"}) + "\n")
    with pytest.raises(ConfigError, match="newer"):
        Journal.open(tmp_path)
    with pytest.raises(ConfigError, match="already holds a journal"):
        Journal.create(tmp_path)


def test_content_addressed_files_are_relative_and_written_once(tmp_path):
    journal = Journal.create(tmp_path / "run")
    rel = journal.put_text("replies", "hello", ".md")
    assert rel.startswith("replies/") and rel.endswith(".md") and not Path(rel).is_absolute()
    assert journal.put_text("replies", "hello", ".md") == rel
    assert journal.read_text(rel) == "hello"
    assert journal.put_text("candidates", "src", ".py", sha256="f" * 64) == "candidates/" + "f" * 64 + ".py"


def test_eval_key_ignores_machine_local_settings():
    here = EvalConfig(backend="torch", device="cpu", cache_dir=Path("/a"), runtime=RuntimeConfig(nvcc="/x/nvcc"))
    there = EvalConfig(backend="torch", device="cpu", cache_dir=Path("/b"), gpus=(3,))
    assert eval_key("c", "t", here) == eval_key("c", "t", there)
    assert eval_key("c", "t", here) != eval_key("c", "t", EvalConfig(backend="torch", device="cpu", track="tf32"))
    assert eval_key("c", "t", here) != eval_key("d", "t", here)


def test_caches_and_totals_come_from_the_records(tmp_path):
    journal = Journal.create(tmp_path / "run")
    journal.begin_session()
    reply = Reply("text", "anthropic", "m", "r1", 100, 20, 0.25, 1.0, False)
    journal.append("reply", task_id="t", request_sha256="r1", reply=reply, error=None)
    journal.append("reply", task_id="u", request_sha256="r2", reply=None, error="refused")
    step = Step(task_id="t", index=0, stage="generate", round=0, request_sha256="r1", prompt_path="p",
                reply_path="r", candidate_sha256="c", candidate_path="cp", bad_reply=None, verdict=VERDICT,
                eval_key="k1", profile_shown=False)
    journal.append("step", **to_json(step))
    assert journal.verdict("k1") == VERDICT and journal.verdict("k2") is None
    assert journal.has_step("t", 0) and not journal.has_step("t", 1)
    totals = journal.totals()
    assert (totals["llm_calls"], totals["input_tokens"], totals["output_tokens"]) == (2, 100, 20)
    assert totals["cost_usd"] == pytest.approx(0.25) and totals["gpu_s"] == pytest.approx(3.5)
    assert journal.totals("u")["llm_calls"] == 1 and journal.totals("u")["gpu_s"] == 0


def test_wall_time_sums_sessions(tmp_path):
    journal = Journal.create(tmp_path / "run")
    records = [("session", 100.0), ("step", 110.0), ("session", 500.0), ("step", 530.0)]
    journal.path.write_text("".join(json.dumps({"schema_version": 1, "kind": k, "time": t, "task_id": "x",
                                                "index": 0}) + "\n" for k, t in records))
    assert Journal.open(tmp_path / "run").wall_s() == pytest.approx(40.0)


def test_a_run_directory_is_portable(tmp_path):
    task = load_task(REPO / "examples" / "tasks" / "swish_scale.py")
    journal = Journal.create(tmp_path / "a" / "run1")
    start_run(journal, [task], "replay:replay.jsonl", AgentConfig(rounds=2), EvalConfig(backend="torch", device="cpu"))
    shutil.move(str(tmp_path / "a" / "run1"), str(tmp_path / "b"))
    setup = load_run(Journal.open(tmp_path / "b"))
    assert setup.model == "replay:replay.jsonl" and setup.agent["rounds"] == 2
    assert setup.evaluation["backend"] == "torch" and "cache_dir" not in setup.evaluation
    (moved,) = setup.tasks
    assert moved.path == tmp_path / "b" / "tasks" / "swish_scale.py"
    assert moved.source_sha256 == task.source_sha256 and moved.task_id == "swish_scale"
    assert str(tmp_path) not in (tmp_path / "b" / "journal.jsonl").read_text()
    moved.path.write_text(moved.source + "# edited\nx = 1\n")
    with pytest.raises(ConfigError, match="changed after the run started"):
        load_run(Journal.open(tmp_path / "b"))
