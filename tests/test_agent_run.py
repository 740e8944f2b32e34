"""The agent workflow end to end on CPU: recorded replies (torch backend) through the real evaluator.

examples/replays/swish_scale_torch.jsonl answers swish_scale with: a module that fails to import,
its repair, a correct but slower "optimization" (a stable sigmoid with extra passes), and a faster one.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from cutegen.agent import EXIT_DONE, EXIT_NEEDS_GPU, Agent, target_reached
from cutegen.config import AgentConfig, Budget, EvalConfig, ProviderSettings
from cutegen.evaluate.verdict import required_gain
from cutegen.journal import JOURNAL, Journal, load_run, start_run
from cutegen.llm import provider_from_spec
from cutegen.records import TimingStats, Verdict, to_json
from cutegen.report import write_outputs
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "swish_scale.py"
REPLAY = REPO / "examples" / "replays" / "swish_scale_torch.jsonl"
PROFILE_TEXT = "DRAM throughput 31% of peak; profile text supplied by the test's profiler"


def recorded(index: int) -> str:
    lines = [json.loads(line) for line in REPLAY.read_text().splitlines()]
    return lines[index + 1]["text"]  # line 0 describes the file


@pytest.fixture(scope="module")
def eval_cache(tmp_path_factory) -> Path:
    # Shared by the tests here: the reference probe and baselines are measured once.
    return tmp_path_factory.mktemp("eval-cache")


def eval_config(cache: Path, **over) -> EvalConfig:
    fields = dict(backend="torch", device="cpu", correctness_trials=2, weight_seeds=1, timing_trials=15,
                  warmup_trials=2, timing_input_sets=2, timed_output_checks=1, compile_baseline=False,
                  cache_dir=cache)
    fields.update(over)
    return EvalConfig(**fields)


def start(tmp_path: Path, replay: Path, agent_config: AgentConfig, evaluation: EvalConfig):
    journal = Journal.create(tmp_path / "run")
    start_run(journal, [load_task(TASK)], f"replay:{replay}", agent_config, evaluation)
    provider = provider_from_spec(f"replay:{replay}", ProviderSettings(state_dir=journal.run_dir))
    return journal, provider


def run_agent(journal, provider, agent_config, evaluation, **kwargs) -> tuple[int, Agent]:
    agent = Agent(journal, provider, agent_config, evaluation, **kwargs)
    journal.begin_session()
    status = asyncio.run(agent.run(list(load_run(journal).tasks)))
    return status, agent


def prompt_text(journal: Journal, step) -> str:
    return json.loads(journal.read_text(step.prompt_path))[1]["content"]


def source(journal: Journal, step) -> str:
    return journal.read_text(step.candidate_path).strip()


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory, eval_cache):
    """The recorded replies through the real evaluator: (status, journal, agent). Its journal is also
    the recorded run that tests/test_agent_stop.py replays with the verdicts of a GPU."""
    config = AgentConfig(rounds=2, repairs=1, generations=1, patience=3, profiling="delayed:1")
    evaluation = eval_config(eval_cache)
    journal, provider = start(tmp_path_factory.mktemp("recorded"), REPLAY, config, evaluation)
    status, agent = run_agent(journal, provider, config, evaluation,
                              profiler=lambda path, task, cfg: PROFILE_TEXT)
    return status, journal, agent


def test_generate_fail_repair_optimize_twice_with_delayed_profile(recorded_run):
    status, journal, agent = recorded_run
    assert status == EXIT_DONE
    steps = journal.steps("swish_scale")
    assert [(s.stage, s.round) for s in steps] == [
        ("generate", 0), ("repair_build", 0), ("optimize", 1), ("optimize", 2)]
    failed = steps[0].verdict
    assert not failed.passed and failed.stage == "build" and "swish" in failed.feedback
    assert all(s.verdict.passed for s in steps[1:])
    assert "swish" in prompt_text(journal, steps[1])  # the repair prompt carries the import error
    # Profile feedback withheld in round 1 (delayed:1), given from round 2 on.
    assert [s.profile_shown for s in steps] == [False, False, False, True]
    round1 = prompt_text(journal, steps[2])
    assert PROFILE_TEXT not in round1 and "Profile of the best kernel" not in round1
    assert PROFILE_TEXT in prompt_text(journal, steps[3])
    # Round 2 starts from the best kernel so far, not the latest. Round 1's stable sigmoid makes several
    # times more passes over memory than the repaired kernel, so it is normally discarded; CPU timings
    # are noisy, so the check follows the agent's recorded decision either way.
    assert steps[1].improved
    best_before_round2 = steps[2] if steps[2].improved else steps[1]
    round2 = prompt_text(journal, steps[3]).split("Its measurements")[0]
    assert source(journal, best_before_round2) in round2
    if not steps[2].improved:
        assert "torch.where" not in round2
        assert "round 1: correct but not faster" in prompt_text(journal, steps[3])
    assert journal.task_end("swish_scale")["reason"] == "2 optimization round(s) done"
    assert [r["kind"] for r in journal.records].count("reply") == 4
    assert len(journal.of_kind("profile")) == 1  # profiled once, for the one best kernel it showed

    result = agent.result("swish_scale")
    assert result.status == "done" and result.llm_calls == 4
    assert result.best_sha256 in {s.candidate_sha256 for s in steps}
    write_outputs(journal, [result])
    best = (journal.run_dir / "best" / "swish_scale.py").read_text()
    assert "class ModelNew" in best
    report = (journal.run_dir / "report.md").read_text()
    assert "not a live model's output" in report and "| swish_scale | done |" in report


def write_replay(path: Path, texts: list[tuple[str, str]]) -> Path:
    lines = [{"about": "test replies, not the output of any model"}]
    lines += [{"task": "swish_scale", "stage": stage, "model": "test (recorded)", "text": text}
              for stage, text in texts]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_unusable_replies_are_failed_attempts_then_a_fresh_generation(tmp_path, eval_cache):
    replay = write_replay(tmp_path / "replay.jsonl", [
        ("generate", "I would write a fused kernel for this."),   # no code: a failed attempt
        ("generate", recorded(0)),                                 # asked again: fails to import
        ("generate", recorded(1)),                                 # repairs used up: a fresh start
    ])
    config = AgentConfig(rounds=0, repairs=1, generations=2)
    evaluation = eval_config(eval_cache, do_timing=False)
    journal, provider = start(tmp_path, replay, config, evaluation)
    status, _ = run_agent(journal, provider, config, evaluation)
    assert status == EXIT_DONE
    steps = journal.steps()
    assert [s.stage for s in steps] == ["generate"] * 3
    assert "no fenced code block" in steps[0].bad_reply and steps[0].verdict is None
    assert "no fenced code block" in prompt_text(journal, steps[1])  # the model is told why
    assert steps[1].verdict.stage == "build" and steps[2].verdict.passed
    assert "Your previous reply could not be used" not in prompt_text(journal, steps[2])
    assert journal.task_end("swish_scale")["reason"] == "0 optimization round(s) done"


def test_budget_stops_new_calls(tmp_path, eval_cache):
    replay = write_replay(tmp_path / "replay.jsonl", [("generate", "Let me think about it."),
                                                      ("generate", recorded(1))])
    config = AgentConfig(rounds=3, repairs=1, budget=Budget(llm_calls=1))
    evaluation = eval_config(eval_cache, do_timing=False)
    journal, provider = start(tmp_path, replay, config, evaluation)
    status, agent = run_agent(journal, provider, config, evaluation)
    assert status == EXIT_DONE and len(journal.of_kind("reply")) == 1
    assert journal.task_end("swish_scale")["reason"] == "budget spent: 1 of 1 model calls"
    assert agent.result("swish_scale").best_sha256 is None and agent.result("swish_scale").steps == 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the exit of a machine without a GPU")
def test_a_machine_without_gpu_stops_before_evaluating(tmp_path):
    config = AgentConfig(rounds=1, repairs=1)
    evaluation = EvalConfig(backend="torch", device="cuda", cache_dir=tmp_path / "cache")
    journal, provider = start(tmp_path, REPLAY, config, evaluation)
    for _ in range(2):  # the second session replays the recorded reply: no new call
        status, agent = run_agent(Journal.open(journal.run_dir), provider, config, evaluation)
        assert status == EXIT_NEEDS_GPU and agent.result("swish_scale").status == "needs_gpu"
    reopened = Journal.open(journal.run_dir)
    assert len(reopened.of_kind("reply")) == 1 and not reopened.of_kind("evaluate") and not reopened.of_kind("step")
    assert len((journal.run_dir / "replay_served.jsonl").read_text().splitlines()) == 1


class CountingProvider:
    """A model that thinks for a moment and never writes code; counts the calls in flight at once."""

    model_id = "counting"

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0

    async def complete(self, request):
        from cutegen.llm import request_sha256
        from cutegen.records import Reply

        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.2)
        self.in_flight -= 1
        return Reply("No code today.", "test", "counting", request_sha256(request, self.model_id), None, None,
                     None, 0.2, False)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_tasks_run_concurrently_within_the_call_limit(tmp_path, concurrency):
    names = ("swish_scale", "row_softmax", "layer_norm")
    tasks = [load_task(REPO / "examples" / "tasks" / f"{name}.py") for name in names]
    config = AgentConfig(rounds=0, repairs=1, generations=1, concurrency=concurrency)
    evaluation = EvalConfig(backend="torch", device="cpu", cache_dir=tmp_path / "cache")
    journal = Journal.create(tmp_path / "run")
    start_run(journal, tasks, "counting", config, evaluation)
    provider = CountingProvider()
    status, agent = run_agent(journal, provider, config, evaluation)
    assert status == EXIT_DONE and provider.most == concurrency
    for task in tasks:  # each: a reply without code, asked again once, then given up
        steps = journal.steps(task.task_id)
        assert [s.bad_reply is not None for s in steps] == [True, True]
        assert journal.task_end(task.task_id)["reason"].startswith("no correct kernel after 1 generation")


def test_exchange_run_waits_when_every_task_waits(tmp_path):
    tasks = [load_task(REPO / "examples" / "tasks" / f"{name}.py") for name in ("swish_scale", "row_softmax")]
    config = AgentConfig(rounds=1)
    evaluation = EvalConfig(backend="torch", device="cpu", cache_dir=tmp_path / "cache")
    journal = Journal.create(tmp_path / "run")
    start_run(journal, tasks, "exchange:", config, evaluation)
    provider = provider_from_spec("exchange:", ProviderSettings(state_dir=journal.run_dir))
    status, agent = run_agent(journal, provider, config, evaluation)
    assert status == 75
    assert {agent.result(t.task_id).status for t in tasks} == {"waiting"}
    pending = [json.loads(p.read_text()) for p in provider.pending()]
    assert sorted(p["task_id"] for p in pending) == ["row_softmax", "swish_scale"]
    assert not journal.of_kind("reply")


@pytest.mark.gpu
def test_cute_workflow_on_the_gpu(tmp_path):
    """The recorded CuTe replies (compile error, fix, two optimizations) through the real evaluator."""
    replay = REPO / "examples" / "replays" / "swish_scale_cute.jsonl"
    config = AgentConfig(rounds=2, repairs=1, generations=1, profiling="delayed:1")
    evaluation = EvalConfig(backend="cute", device="cuda", timing_trials=20, compile_baseline=False,
                            cache_dir=tmp_path / "cache")
    journal, provider = start(tmp_path, replay, config, evaluation)
    status, agent = run_agent(journal, provider, config, evaluation)
    assert status == EXIT_DONE
    steps = journal.steps()
    assert [s.stage for s in steps] == ["generate", "repair_build", "optimize", "optimize"]
    assert steps[0].verdict.stage == "build" and "sigmoidf" in steps[0].verdict.feedback
    assert all(s.verdict.passed for s in steps[1:])
    best = agent.result("swish_scale")
    timings = [s.verdict.timing.median_ms for s in steps[1:]]
    # The incumbent stays unless a newcomer is faster by min_gain (or the measured noise, when larger),
    # so the best is within that of the fastest.
    gain = max(required_gain(s.verdict, s.verdict, config.min_gain) for s in steps[1:])
    assert best.best_median_ms <= min(timings) / (1 - gain) + 1e-9


def test_a_gain_must_exceed_the_measured_timing_noise():
    def verdict(noise_pct):
        return Verdict(task_id="t", candidate_sha256="c", track="fp32", backend="cute", passed=True,
                       stage="timing", failure=None, feedback="", noise_pct=noise_pct)

    assert required_gain(verdict(None), verdict(None), 0.02) == 0.02
    assert required_gain(verdict(1.0), verdict(None), 0.02) == 0.02  # quieter than min_gain
    assert required_gain(verdict(None), verdict(12.5), 0.02) == 0.125  # the noisier of the two counts


# ------------------------------------------------------------------ the target stop rule, replayed
# A kernel near the reference algorithm's work bound but slower than torch.compile is optimized further;
# only one also faster than both baselines stops the task on the target. The recorded run above is
# replayed from its journal with each passing verdict as an H200 measured it: the journal is where a
# split run's GPU side leaves its verdicts, and a resumed agent takes every verdict from it.

BOUND_MS, EAGER_MS, COMPILE_MS = 0.70, 1.00, 0.74


def gpu_verdict(median_ms: float, compiled_ms: float | None = COMPILE_MS, eager_ms: float | None = EAGER_MS) -> Verdict:
    def stats(ms: float) -> TimingStats:
        return TimingStats(median_ms=ms, mean_ms=ms, min_ms=ms, iqr_ms=0.001, trials=100)

    return Verdict(task_id="swish_scale", candidate_sha256="c", track="fp32", backend="torch", passed=True,
                   stage="timing", failure=None, feedback="", timing=stats(median_ms),
                   eager=stats(eager_ms) if eager_ms else None, compiled=stats(compiled_ms) if compiled_ms else None,
                   speedup_vs_eager=eager_ms / median_ms if eager_ms else None,
                   speedup_vs_compile=compiled_ms / median_ms if compiled_ms else None,
                   sol_bound_ms=BOUND_MS, sol_fraction=BOUND_MS / median_ms, noise_pct=0.2)


def test_the_target_needs_the_bound_and_both_baselines_beaten():
    between = gpu_verdict(0.76)  # 92% of the bound, 0.97x torch.compile: the case met on the H200
    assert between.sol_fraction >= 0.9 and target_reached(between, 0.9) is None
    assert target_reached(gpu_verdict(0.72, compiled_ms=0.71), 0.9) is None  # 1.01 vs 1.00: still slower
    assert target_reached(gpu_verdict(0.72, eager_ms=0.71), 0.9) is None  # eager is the faster baseline here
    assert target_reached(gpu_verdict(0.72, compiled_ms=None, eager_ms=None), 0.9) is None  # nothing to beat
    assert target_reached(gpu_verdict(0.72), 0.99) is None  # 97% of the bound: short of this target
    assert target_reached(gpu_verdict(0.72), 0.9) == ("target reached: best kernel at 97% of the reference"
                                                      " algorithm's work bound and 1.03x torch.compile, the faster"
                                                      " baseline")
    assert "1.39x eager" in target_reached(gpu_verdict(0.72, compiled_ms=None), 0.9)  # torch.compile failed


def as_measured_on_the_gpu(recorded: Path, target: Path, medians: list[float]) -> Journal:
    """A copy of the recorded run whose passing verdicts carry these medians (the repair's, then each
    optimization's) with both baselines and the work bound; the task's end is left to the replay."""
    shutil.copytree(recorded, target)
    records = [json.loads(line) for line in (target / JOURNAL).read_text().splitlines()]
    passing = iter(medians)
    for record in records:
        if record["kind"] == "step" and record["verdict"] and record["verdict"]["passed"]:
            record["verdict"] = {**to_json(gpu_verdict(next(passing))), "candidate_sha256": record["candidate_sha256"]}
    kept = [r for r in records if r["kind"] not in ("task_end", "exit")]
    (target / JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in kept))
    return Journal.open(target)


def replay_with_target(journal: Journal, evaluation: EvalConfig) -> tuple[int, Agent]:
    config = AgentConfig(rounds=5, repairs=1, generations=1, patience=3, profiling="none", target_sol_fraction=0.9)
    provider = provider_from_spec(f"replay:{REPLAY}", ProviderSettings(state_dir=journal.run_dir))
    status, agent = run_agent(journal, provider, config, evaluation)
    write_outputs(journal, [agent.result("swish_scale")])
    return status, agent


def test_a_kernel_between_90_percent_of_the_bound_and_torch_compile_is_optimized_further(recorded_run, eval_cache,
                                                                                         tmp_path):
    # The repair: 92% of the bound but 0.97x torch.compile. Round 1 is slower; round 2's kernel reaches
    # 97% of the bound and beats torch.compile, which stops the task before a third round.
    journal = as_measured_on_the_gpu(recorded_run[1].run_dir, tmp_path / "run", [0.76, 2.0, 0.72])
    evaluations = len(journal.of_kind("evaluate"))
    status, agent = replay_with_target(journal, eval_config(eval_cache))
    assert status == EXIT_DONE and len(journal.of_kind("evaluate")) == evaluations  # verdicts from the journal
    end = journal.task_end("swish_scale")
    assert end["reason"].startswith("target reached: best kernel at 97% of the reference algorithm's work bound")
    assert end["steps"] == 4 and end["best_sha256"] == journal.steps("swish_scale")[3].candidate_sha256
    assert agent.result("swish_scale").stop_reason == end["reason"]
    report = (journal.run_dir / "report.md").read_text()
    assert "| 0.72 | 1.39x | 1.03x | 97.2% |" in report and "target reached" in report


def test_a_kernel_past_the_target_and_both_baselines_stops_the_task(recorded_run, eval_cache, tmp_path):
    journal = as_measured_on_the_gpu(recorded_run[1].run_dir, tmp_path / "run", [0.73, 2.0, 0.72])
    status, _ = replay_with_target(journal, eval_config(eval_cache))
    end = journal.task_end("swish_scale")
    assert status == EXIT_DONE and end["reason"] == ("target reached: best kernel at 96% of the reference algorithm's"
                                                     " work bound and 1.01x torch.compile, the faster baseline")
    assert end["steps"] == 2  # stopped after the repair: no optimization round was asked


class _FirstVerdictNotTheCandidates:
    """This machine's executor, but the first `blind` verdicts of each evaluation are made infrastructure
    verdicts (as a blind profiler or a GPU shared past the evaluator's waits would give)."""

    def __init__(self, executor, blind: int) -> None:
        self.executor, self.blind, self.calls = executor, blind, 0
        self.slots, self.lanes, self.build_jobs, self.retries = executor.slots, 1, executor.build_jobs, []

    def evaluate(self, path, task, config, **kwargs):
        from dataclasses import replace

        self.calls += 1
        verdict = self.executor.evaluate(path, task, config, **kwargs)
        if self.calls > self.blind:
            return verdict
        return replace(verdict, passed=False, infrastructure=True, failure="kernel_audit_unavailable",
                       feedback="Not a verdict on the candidate: the profiler recorded no device activity")

    def device_available(self):
        return True

    def profile(self, profiler, path, task, config):
        return None

    def close(self):
        self.executor.close()


@pytest.mark.parametrize("blind", [1, 2])
def test_an_infrastructure_verdict_is_judged_again_before_the_model_hears_of_it(tmp_path, eval_cache, blind):
    """A verdict that is not one on the candidate is journaled as `evaluate_retry` and the candidate
    judged once more: the step carries the second verdict (the candidate's own), or, when that is
    again not the candidate's, that one, which says so; never more than INFRASTRUCTURE_RETRIES again."""
    from cutegen.agent import INFRASTRUCTURE_RETRIES
    from cutegen.evaluate.executor import LocalExecutor

    config = AgentConfig(rounds=0, repairs=0, generations=1, profiling="none")
    evaluation = eval_config(eval_cache)
    journal, provider = start(tmp_path, REPLAY, config, evaluation)
    with LocalExecutor(evaluation) as local:
        executor = _FirstVerdictNotTheCandidates(local, blind)
        run_agent(journal, provider, config, evaluation, executor=executor)
    done = Journal.open(journal.run_dir)
    (step,) = done.steps()
    retries = done.of_kind("evaluate_retry")
    assert INFRASTRUCTURE_RETRIES == 1 and executor.calls == 2 and len(retries) == 1
    assert retries[0]["reason"].startswith("kernel_audit_unavailable") and retries[0]["where"] == "the evaluator"
    if blind == 1:  # the candidate's own verdict: the recorded first reply does not import
        assert not step.verdict.infrastructure and step.verdict.failure != "kernel_audit_unavailable"
    else:
        assert step.verdict.infrastructure and "Not a verdict on the candidate" in step.verdict.feedback
