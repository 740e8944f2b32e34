"""Search strategies end to end on the CPU: recorded replies through the real evaluator (torch backend).

The replies are hand-written test data, not a model's output: examples/replays/swish_scale_torch_beam.jsonl
(beam:2,2, two rounds: directions, side-by-side proposals with a wrong result, an import error, a reply
without code and a kernel already judged, and their repairs) and swish_scale_torch_best_of.jsonl
(best-of:3 stopped by the call budget in the middle of its repairs). One evaluation service serves
every run here, so the task's reference process and baselines are made once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from cutegen import bench
from cutegen.agent import EXIT_DONE, EXIT_WAITING, Agent
from cutegen.config import AgentConfig, Budget, EvalConfig, ProviderSettings, search_policy
from cutegen.errors import ConfigError
from cutegen.journal import JOURNAL, Journal, load_run, start_run
from cutegen.llm import provider_from_spec
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "swish_scale.py"
BEAM = REPO / "examples" / "replays" / "swish_scale_torch_beam.jsonl"
BEST_OF = REPO / "examples" / "replays" / "swish_scale_torch_best_of.jsonl"
BEAM_CONFIG = AgentConfig(rounds=2, repairs=1, generations=1, patience=3, profiling="none", search="beam:2,2")


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    from cutegen.evaluate.executor import LocalExecutor

    # The smallest judgement that still tells the replies apart: these tests check the search, not timing.
    config = EvalConfig(backend="torch", device="cpu", correctness_trials=1, weight_seeds=1, timing_trials=5,
                        warmup_trials=1, timing_input_sets=1, timed_output_checks=1, compile_baseline=False,
                        cache_dir=tmp_path_factory.mktemp("eval-cache"))
    with LocalExecutor(config) as executor:
        yield config, executor


def start(run_dir: Path, replay: Path, config: AgentConfig, evaluation) -> Journal:
    journal = Journal.create(run_dir)
    start_run(journal, [load_task(TASK)], f"replay:{replay}", config, evaluation[0])
    return journal


def run_agent(run_dir: Path, replay: Path, config: AgentConfig, evaluation) -> tuple[int, Agent, Journal]:
    """One session, as `cutegen resume` runs it: the journal opened, the replay log beside it."""
    journal = Journal.open(run_dir)
    provider = provider_from_spec(f"replay:{replay}", ProviderSettings(state_dir=journal.run_dir))
    agent = Agent(journal, provider, config, evaluation[0], executor=evaluation[1])
    journal.begin_session()
    status = asyncio.run(agent.run(list(load_run(journal).tasks)))
    return status, agent, journal


def prompt_of(journal: Journal, step) -> str:
    return json.loads(journal.read_text(step.prompt_path))[1]["content"]


def served(run_dir: Path) -> list[int]:
    log = run_dir / "replay_served.jsonl"
    return [json.loads(line)["seq"] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def beam_run(tmp_path_factory, evaluation):
    run_dir = tmp_path_factory.mktemp("beam") / "run"
    start(run_dir, BEAM, BEAM_CONFIG, evaluation)
    status, agent, journal = run_agent(run_dir, BEAM, BEAM_CONFIG, evaluation)
    assert status == EXIT_DONE
    return run_dir, agent, journal


def test_beam_rounds_ask_distinct_directions_side_by_side(beam_run):
    run_dir, agent, journal = beam_run
    replies = journal.of_kind("reply")
    assert [r["stage"] for r in sorted(replies, key=lambda r: r["seq"])] == [
        "generate", "directions", "optimize", "optimize", "repair_correctness", "directions", "directions",
        "optimize", "optimize", "optimize", "optimize", "repair_build", "optimize"]
    assert sorted(served(run_dir)) == list(range(13))  # each recorded reply asked for once
    steps = journal.steps("swish_scale")  # directions calls give no candidate: no step
    assert [(s.index, s.stage, s.round) for s in steps] == [
        (0, "generate", 0), (1, "optimize", 1), (2, "optimize", 1), (3, "repair_correctness", 1),
        (4, "optimize", 2), (5, "optimize", 2), (6, "optimize", 2), (7, "optimize", 2), (8, "repair_build", 2),
        (9, "optimize", 2)]
    # Round 1's two proposals were asked before either was judged, and judged side by side.
    positions = {r["seq"]: i for i, r in enumerate(journal.records) if r["kind"] == "reply"}
    first_step = min(i for i, r in enumerate(journal.records) if r["kind"] == "step" and r["round"] == 1)
    assert positions[2] < first_step and positions[3] < first_step
    assert [r["kind"] for r in journal.records[positions[2]:first_step]].count("evaluate") == 2
    # Each proposal has its own direction and is told the other one in flight.
    one, two = prompt_of(journal, steps[1]), prompt_of(journal, steps[2])
    fuse, fresh = "Fuse x * sigmoid(x) into one silu pass", "Compute the sigmoid into a fresh tensor"
    assert f"Optimize in this direction: **{fuse}" in one and f"- {fresh}" in one
    assert f"Optimize in this direction: **{fresh}" in two and f"- {fuse}" in two
    assert (steps[1].direction, steps[2].direction) == (
        f"{fuse}, then scale in place", f"{fresh} and do both multiplies in place")
    # The tree: optimizations hang under the kernel they were asked of, repairs under what they fix.
    assert steps[1].parent_sha256 == steps[2].parent_sha256 == steps[0].candidate_sha256
    assert steps[3].parent_sha256 == steps[2].candidate_sha256 and steps[2].verdict.stage == "correctness"
    assert steps[1].idea == "silu in one pass, then the scale in place."
    # Round 2 asks four proposals, two from each of the two kernels kept after round 1.
    kept = {s.candidate_sha256 for s in steps[:4] if s.verdict.passed}
    parents = [s.parent_sha256 for s in steps[4:8]]
    assert parents[0] == parents[1] != parents[2] == parents[3] and set(parents) <= kept
    # The second kernel's directions reply listed none: its proposals pick their own, told the others'.
    own = prompt_of(journal, steps[6])
    assert "Choose a direction of your own" in own and "- Use torch.special.expit with in-place multiplies" in own
    # A proposal that repeats a judged kernel reuses its verdict: every evaluation ran once.
    assert steps[7].candidate_sha256 == steps[1].candidate_sha256 and steps[7].verdict == steps[1].verdict
    started = [r["eval_key"] for r in journal.of_kind("evaluate")]
    assert len(started) == len(set(started)) == 7
    # The agent's best is the one the journal's fold names (what reports and `best/` use).
    result = agent.result("swish_scale")
    assert result.best_sha256 == bench.agent_task_result(journal, load_run(journal).tasks[0]).candidate_sha256
    assert journal.task_end("swish_scale")["reason"] == "2 optimization round(s) done"


def test_the_idea_memory_reaches_the_next_round(beam_run):
    _, agent, journal = beam_run
    steps = journal.steps("swish_scale")
    round2 = prompt_of(journal, steps[4])
    assert "## Ideas already tried on this task, with their outcomes" in round2
    assert "- round 1, proposal 1 of 2: " in round2 and "— idea: silu in one pass, then the scale in place." in round2
    line = next(x for x in round2.splitlines() if x.startswith("- round 1, proposal 2 of 2: "))
    assert "after 1 repair(s)" in line and line.endswith("— idea: sigmoid into a fresh tensor, multiplies in place.")
    assert "the speed of its starting kernel" in line and "Start your reply with one line `Idea:" in round2
    assert "Ideas already tried" not in prompt_of(journal, steps[1])  # round 1 had none
    # Round 2's outcomes, as round 3 would have been told them.
    ideas = agent.states["swish_scale"].ideas[2:]
    assert len(ideas) == 4 and all(i.startswith("round 2, proposal ") for i in ideas)
    assert "(from " in ideas[0] and ideas[0].endswith("— idea: expit with in-place multiplies.")
    assert "after 1 repair(s): " in ideas[1] and "the speed of its starting kernel" in ideas[1]  # import error fixed
    assert ideas[2].split(": ", 1)[1].startswith("no usable reply after 1 repair(s)")
    assert ideas[3].endswith("— idea: The same silu kernel again: it is hard to beat one pass over memory.")


def test_resume_after_a_kill_repeats_no_call_and_no_evaluation(beam_run, tmp_path, evaluation):
    """A kill can land between any two records (each is fsynced): cut the journal in round 2's repair
    batch, where a repair is being judged while the other plan's call is asked, and resume; the run
    ends where the uninterrupted one did, having asked and judged only what the cut lost."""
    run_dir, _, journal = beam_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "replay_served.jsonl").unlink()
    repair = next(i for i, r in enumerate(journal.records) if r["kind"] == "reply" and r["seq"] == 11)
    cut = next(i for i, r in enumerate(journal.records) if i > repair and r["kind"] == "evaluate")
    kept = journal.records[: cut + 1]  # the repair's evaluation started, not finished
    (copy / JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in kept))
    asked = {r["seq"] for r in kept if r["kind"] == "reply"}
    judged = {r["eval_key"] for r in kept if r["kind"] == "step" and r.get("eval_key")}
    assert 0 < len(asked) < 13 and kept[-1]["eval_key"] not in judged

    status, _, resumed = run_agent(copy, BEAM, BEAM_CONFIG, evaluation)
    assert status == EXIT_DONE
    assert sorted(served(copy)) == sorted(set(range(13)) - asked)  # no recorded call asked again
    again = [r["eval_key"] for r in resumed.records[len(kept):] if r["kind"] == "evaluate"]
    assert again == [kept[-1]["eval_key"]]  # only the interrupted evaluation runs again
    shape = [(s.index, s.stage, s.candidate_sha256, s.parent_sha256) for s in resumed.steps("swish_scale")]
    assert shape == [(s.index, s.stage, s.candidate_sha256, s.parent_sha256) for s in journal.steps("swish_scale")]


def test_report_shows_the_search_tree_and_the_budget_curve(beam_run, tmp_path):
    from cutegen.report import write_report

    run_dir, _, _ = beam_run
    run = bench.load_run(run_dir)
    points = run.results[0].trajectory
    assert [p.llm_calls for p in points][:2] == [1, 4]  # the generation; round 1's first proposal came 4th
    assert all(p.gpu_s is not None for p in points) and sum(p.improved for p in points) >= 1
    md, html = write_report([run], tmp_path / "report")
    text = md.read_text()
    assert "## Search trees" in text and "search beam:2,2" in text
    tree = text.split("## Search trees")[1]
    assert "\n- #0 generate" in tree and "\n  - #1 optimize (round 1)" in tree
    assert "\n    - #3 repair_correctness (round 1)" in tree  # under the proposal it repaired
    assert "Idea: silu in one pass, then the scale in place." in tree
    assert "](plots/budget.svg)" in text and (tmp_path / "report" / "plots" / "budget.svg").is_file()
    assert "Best speedup against budget" in html.read_text()


def test_best_of_generates_side_by_side_and_the_budget_stops_mid_batch(tmp_path, evaluation):
    config = AgentConfig(rounds=1, repairs=1, generations=1, profiling="none", search="best-of:3",
                         budget=Budget(llm_calls=4))
    run_dir = tmp_path / "run"
    start(run_dir, BEST_OF, config, evaluation)
    status, agent, journal = run_agent(run_dir, BEST_OF, config, evaluation)
    assert status == EXIT_DONE
    # Three generations asked at once; then the one without code is asked again (the 4th call) and the
    # repair of the import error would be the 5th: refused, the budget counting the call in flight.
    assert served(run_dir) == [0, 1, 2, 3]
    assert journal.task_end("swish_scale")["reason"] == "budget spent: 4 of 4 model calls"
    steps = journal.steps("swish_scale")
    assert [(s.stage, s.bad_reply is None, s.verdict.passed if s.verdict else None) for s in steps] == [
        ("generate", True, True), ("generate", False, None), ("generate", True, False), ("generate", True, True)]
    assert "Your previous reply could not be used" in prompt_of(journal, steps[3])
    positions = {r["seq"]: i for i, r in enumerate(journal.records) if r["kind"] == "reply"}
    first_verdict = min(i for i, r in enumerate(journal.records) if r["kind"] == "step" and r.get("verdict"))
    assert max(positions[0], positions[1], positions[2]) < first_verdict
    evaluations = [i for i, r in enumerate(journal.records) if r["kind"] == "evaluate"]
    assert evaluations[1] < first_verdict  # two generations judged side by side
    # The best correct generation is kept (the paid 4th reply was judged before the task stopped).
    result = agent.result("swish_scale")
    assert result.best_sha256 in {steps[0].candidate_sha256, steps[3].candidate_sha256}
    assert result.best_sha256 == bench.agent_task_result(journal, load_run(journal).tasks[0]).candidate_sha256


def test_prompts_give_each_output_its_tolerance_and_the_dim3_pitfall(tmp_path):
    """The first prompt of a bf16 task and of an fp32 one (exchange: written as files, nothing judged)."""
    tasks = [load_task(REPO / "examples" / "tasks" / name) for name in ("matmul_bf16.py", "swish_scale.py")]
    config, evaluation = AgentConfig(rounds=0), EvalConfig(backend="cute", device="cuda", cache_dir=tmp_path / "c")
    journal = Journal.create(tmp_path / "run")
    start_run(journal, tasks, "exchange:", config, evaluation)
    provider = provider_from_spec("exchange:", ProviderSettings(state_dir=journal.run_dir))
    assert asyncio.run(Agent(journal, provider, config, evaluation).run(tasks)) == EXIT_WAITING
    requests = {r["task_id"]: r["messages"] for r in map(json.loads, map(Path.read_text, provider.pending()))}
    system, user = (m["content"] for m in requests["matmul_bf16"])
    assert "atol = rtol = 2e-2 for bfloat16 outputs" in system and "1e-4" not in system
    assert "dim3 grid(unsigned(n));" in user and "dim3 const grid{unsigned(n)};" in user
    assert "## Build errors to avoid up front" in user and "dim3 const grid{" in user.split("## Build errors")[0]
    system, _ = (m["content"] for m in requests["swish_scale"])
    assert "atol = rtol = 1e-4 for float32 outputs" in system and "2e-2" not in system


def test_optimize_prompts_carry_the_pitfalls_the_idea_request_and_the_direction():
    from test_agent_prompt import optimize_context

    from cutegen import prompt

    context = optimize_context(direction="Vectorise with float4", in_flight=["Fuse the scale"], rank=2,
                               history=["round 1: build error (build_error) — idea: tile by 8"])
    user = prompt.messages("optimize", backend="cute", track="fp32", **context)[1].content
    assert "## Build errors to avoid up front" in user and "dim3 const grid{unsigned(n)};" in user
    assert "- round 1: build error (build_error) — idea: tile by 8" in user
    assert "Optimize in this direction: **Vectorise with float4**" in user and "- Fuse the scale" in user
    assert "number 2 by speed" in user and "Start your reply with one line `Idea:" in user
    assert "## Build errors" not in prompt.messages("optimize", backend="torch", track="fp32", **context)[1].content


@pytest.mark.parametrize("text, policy", [("single", (1, 1, 1)), ("best-of:4", (4, 1, 1)), ("beam:2,3", (1, 2, 3)),
                                          (" Beam: 3, 1 ", (1, 3, 1))])
def test_search_settings(text, policy):
    found = search_policy(text)
    assert (found.starts, found.width, found.proposals) == policy


@pytest.mark.parametrize("text", ["beam:2", "best-of:0", "greedy", "beam:a,b", "single:2", "best-of:"])
def test_a_malformed_search_setting_is_a_config_error(text):
    with pytest.raises(ConfigError) as err:
        AgentConfig(search=text)
    assert repr(text) in err.value.problem and "beam:W,K" in err.value.fix


def test_the_command_line_refuses_a_malformed_search_before_the_run_starts(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "cutegen", "optimize", str(TASK), "--model", f"replay:{BEAM}",
                           "--search", "beam:2", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "'beam:2' is not understood" in done.stderr and "beam:W,K" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()
