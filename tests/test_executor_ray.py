"""The Ray executor on a real local Ray cluster (CPU only: the torch backend on the CPU device, a custom
resource `fake_gpu` standing in for GPUs): the same verdicts as the local executor for an --evaluate
suite and a replayed agent run, the timing protocol unchanged on an actor, an actor killed
mid-evaluation retried with nothing lost or recorded twice, and a killed driver resumed without
repeating a finished evaluation.

One cluster and one executor (two actors) serve the module; settings are tiny to keep it short.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from cutegen import bench  # noqa: E402
from cutegen.agent import EXIT_DONE, Agent  # noqa: E402
from cutegen.config import AgentConfig, EvalConfig, ExecutorConfig, ProviderSettings  # noqa: E402
from cutegen.evaluate.clock import RETRY_BATCHES  # noqa: E402
from cutegen.evaluate.ray_executor import RayExecutor  # noqa: E402
from cutegen.journal import Journal, load_run, start_run  # noqa: E402
from cutegen.llm import provider_from_spec  # noqa: E402
from cutegen.records import TimingStats, Verdict, from_json  # noqa: E402
from cutegen.tasks import load_task, load_tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
TASK = TASKS / "swish_scale.py"
HONEST = REPO / "tests" / "fixtures" / "honest"
CHEATS = REPO / "tests" / "fixtures" / "cheats"
REPLAY = REPO / "examples" / "replays" / "swish_scale_torch.jsonl"


@pytest.fixture(scope="module")
def cluster() -> str:
    """A local Ray cluster: 3 units of `fake_gpu` (2 for the module's executor, 1 for a CLI driver)."""
    ray.init(num_cpus=2, resources={"fake_gpu": 3}, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The module's cache root (CUTEGEN_CACHE of the CLI runs): the probe and baselines measured once."""
    return tmp_path_factory.mktemp("cache")


def eval_config(cache: Path, **over) -> EvalConfig:
    settings = dict(backend="torch", device="cpu", correctness_trials=2, weight_seeds=1, timing_trials=5,
                    warmup_trials=1, timing_input_sets=1, timed_output_checks=1, compile_baseline=False,
                    cache_dir=cache / "eval")
    settings.update(over)
    return EvalConfig(**settings)


@pytest.fixture(scope="module")
def executor(cluster, cache) -> RayExecutor:
    # Half a CPU each: the CLI driver's actor takes the cluster's last whole one.
    settings = ExecutorConfig(kind="ray", resource="fake_gpu", actors=2, cpus_per_actor=0.5)
    with RayExecutor(settings, eval_config(cache)) as started:
        yield started


@pytest.fixture(scope="module")
def suites(executor, cache, tmp_path_factory) -> dict[str, Path]:
    """One --evaluate suite judged by the local executor and by the Ray executor: an honest candidate,
    one that fails correctness and one the static checks reject, timed (tiny settings)."""
    work = tmp_path_factory.mktemp("suites")
    folder = work / "candidates"
    folder.mkdir()
    for source, name in ((HONEST / "swish_scale.py", "swish_scale.py"),
                         (CHEATS / "40_heap_reference.py", "swish_scale_sample_1.py"),
                         (CHEATS / "12_subprocess.py", "swish_scale_sample_2.py")):
        shutil.copy(source, folder / name)
    tasks = load_tasks(TASKS, "swish_scale")
    with ThreadPoolExecutor(2) as both:  # side by side: each run mostly waits on its own processes
        local = both.submit(bench.evaluate_suite, tasks, folder, work / "local", eval_config(cache))
        remote = both.submit(bench.evaluate_suite, tasks, folder, work / "ray", eval_config(cache), executor=executor)
        local.result(), remote.result()
    return {"local": work / "local", "ray": work / "ray"}


def verdicts(run: Path) -> list[Verdict]:
    records = [json.loads(line) for line in (run / bench.VERDICTS).read_text().splitlines()]
    return [from_json(Verdict, r["verdict"]) for r in sorted(records, key=lambda r: r["sample_id"])]


def test_an_evaluate_suite_on_ray_gives_the_local_verdicts(suites):
    local, remote = verdicts(suites["local"]), verdicts(suites["ray"])
    assert len(remote) == 3  # the driver wrote each verdict once
    outcome = [(v.candidate_sha256, v.passed, v.stage, v.failure) for v in local]
    assert [(v.candidate_sha256, v.passed, v.stage, v.failure) for v in remote] == outcome
    # The heap walk of fixture 40 is refused by the worker's audit hook before its zeros are compared.
    assert [o[1:] for o in outcome] == [(True, "timing", None), (False, "correctness", "guard_refused"),
                                        (False, "static", "check_no_concurrency")]
    def checks(verdict: Verdict) -> list[tuple[str, bool]]:  # a noisy CPU speedup may add a review note
        return [(c.name, c.passed) for c in verdict.checks if c.name != "speedup_review"]

    assert [checks(v) for v in remote] == [checks(v) for v in local]
    throughput = json.loads((suites["ray"] / bench.THROUGHPUT).read_text())
    assert throughput["lanes"] == 2 and throughput["retries"] == 0


def test_the_timing_protocol_runs_unchanged_on_a_ray_actor(suites):
    """An actor's evaluation runs pipeline.evaluate_source, the local code path: the worker's timing
    command (timing.time_forward) gives the same record, with the configured number of timed calls."""
    config = eval_config(Path("unused"))
    local, remote = verdicts(suites["local"])[0], verdicts(suites["ray"])[0]
    # the configured calls, and RETRY_BATCHES more batches where a loaded machine disturbed the clock
    batch = min(config.timed_batch_calls, config.timing_trials)
    assert {remote.timing.trials, local.timing.trials} <= {config.timing_trials,
                                                           config.timing_trials + RETRY_BATCHES * batch}
    assert remote.eager.trials == local.eager.trials == config.timing_trials
    measured = [f.name for f in fields(TimingStats) if getattr(remote.timing, f.name) is not None]
    assert measured == [f.name for f in fields(TimingStats) if getattr(local.timing, f.name) is not None]
    # The same steps, in the same order (a task's first evaluation on a lane adds its reference and
    # baselines: the Ray run may have met the task on another actor first).
    first_only = {"make_room", "reference", "baselines", "peaks"}
    steps = [name for name, _ in remote.stage_s if name not in first_only]
    assert steps == [name for name, _ in local.stage_s if name not in first_only]
    assert {"settle", "timing", "timed_outputs"} <= set(steps)


def test_the_agents_profiler_runs_on_an_actor(executor, cache):
    """Nsight Compute's profiler goes to the task's actor (holding its lane) and its notices come back;
    on the CPU device it has nothing to profile, here as locally. A caller's own profiler runs here."""
    from cutegen.profile.run import make_profiler

    notes: list[str] = []
    task, path = load_task(TASK), HONEST / "swish_scale.py"
    assert executor.profile(make_profiler(notify=notes.append), path, task, eval_config(cache)) is None
    assert notes == []
    assert executor.profile(lambda p, t, c: f"{t.task_id} {p.name}", path, task, eval_config(cache)) == \
        "swish_scale swish_scale.py"


def run_replay(tmp_path: Path, name: str, cache: Path, **agent_kwargs) -> Journal:
    agent_config = AgentConfig(rounds=0, repairs=1, generations=1, profiling="none")
    evaluation = eval_config(cache, do_timing=False)
    journal = Journal.create(tmp_path / name)
    start_run(journal, [load_task(TASK)], f"replay:{REPLAY}", agent_config, evaluation)
    provider = provider_from_spec(f"replay:{REPLAY}", ProviderSettings(state_dir=journal.run_dir))
    agent = Agent(journal, provider, agent_config, evaluation, **agent_kwargs)
    journal.begin_session()
    assert asyncio.run(agent.run(list(load_run(journal).tasks))) == EXIT_DONE
    return journal


def kill_an_actor_mid_evaluation(executor: RayExecutor, journal_path: Path, killed: list) -> None:
    """SIGKILL the actor running the run's second evaluation (a full one: the first fails its import)
    while it runs; the pid comes from the actor itself."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not killed:
        text = journal_path.read_text() if journal_path.exists() else ""
        if text.count('"kind": "evaluate"') >= 2:
            busy = [s for s in executor.status() if s["evaluating"]]
            if busy:
                os.kill(busy[0]["pid"], signal.SIGKILL)
                killed.append(busy[0]["pid"])
        time.sleep(0.05)


def test_a_replayed_agent_run_on_ray_matches_local_with_an_actor_killed_mid_evaluation(executor, cache, tmp_path):
    killed: list[int] = []
    killer = threading.Thread(target=kill_an_actor_mid_evaluation,
                              args=(executor, tmp_path / "ray" / "journal.jsonl", killed))
    retries_before = len(executor.retries)
    killer.start()
    try:
        with ThreadPoolExecutor(2) as both:
            local = both.submit(run_replay, tmp_path, "local", cache)
            remote = both.submit(run_replay, tmp_path, "ray", cache, executor=executor)
            local, remote = local.result(), remote.result()
    finally:
        killer.join()
    assert killed, "no evaluation was seen in flight"

    def outcome(journal):
        return [(s.stage, s.round, s.candidate_sha256, s.eval_key, s.verdict.passed, s.verdict.stage,
                 s.verdict.failure) for s in journal.steps()]

    assert outcome(remote) == outcome(local)
    assert [o[:2] + o[4:6] for o in outcome(remote)] == [("generate", 0, False, "build"),
                                                         ("repair_build", 0, True, "anticheat")]
    (retry,) = remote.of_kind("evaluate_retry")  # counted once, journaled by the driver
    assert retry["attempt"] == 1 and retry["task_id"] == "swish_scale" and str(killed[0]) in retry["where"]
    assert len(executor.retries) == retries_before + 1
    steps, started = remote.of_kind("step"), [r["eval_key"] for r in remote.of_kind("evaluate")]
    assert retry["eval_key"] == steps[1]["eval_key"]
    assert len(steps) == 2 and len({(s["task_id"], s["index"]) for s in steps}) == 2  # no step twice
    assert len(started) == len(set(started)) == 2  # the retry is the same evaluation, not another one


def cutegen(args: list[str], cwd: Path, cache: Path, **env_over: str) -> subprocess.Popen:
    # RAY_* stays: ray.init set RAY_AUTH_MODE here, which a second driver of the cluster needs too.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTEGEN_", "ANTHROPIC_", "OPENAI_"))}
    env.update(CUTEGEN_CACHE=str(cache), PYTHONUNBUFFERED="1", **env_over)
    return subprocess.Popen([sys.executable, "-m", "cutegen", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_driver_killed_mid_evaluation_resumes_on_ray_and_repeats_no_finished_evaluation(cluster, cache, tmp_path):
    on_ray = ["--executor", f"ray:{cluster}", "--ray-resource", "fake_gpu"]
    args = ["optimize", str(TASK), "--model", f"replay:{REPLAY}", "--rounds", "0", "--repairs", "1",
            "--backend", "torch", "--device", "cpu", "--correctness-trials", "2", "--timing-trials", "5",
            "--no-compile-baseline", "--runs-dir", "runs", "--run-id", "r1", *on_ray]
    driver = cutegen(args, tmp_path, cache)
    journal_path = tmp_path / "runs" / "r1" / "journal.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and driver.poll() is None:
        text = journal_path.read_text() if journal_path.exists() else ""
        if text.count('"kind": "evaluate"') == 2 and text.count('"kind": "step"') == 1:
            break  # the repair's evaluation is in flight on the cluster
        time.sleep(0.05)
    assert driver.poll() is None, driver.communicate()[0]
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    before = Journal.open(tmp_path / "runs" / "r1")
    finished = [s.eval_key for s in before.steps()]
    assert len(finished) == 1 and len(before.of_kind("evaluate")) == 2

    resumed = cutegen(["resume", "runs/r1", *on_ray], tmp_path, cache)
    out = resumed.communicate(timeout=240)[0]
    assert resumed.returncode == 0, out
    after = Journal.open(tmp_path / "runs" / "r1")
    assert after.records[: len(before.records)] == before.records  # append-only
    assert [(s.stage, s.verdict.passed) for s in after.steps()] == [("generate", False), ("repair_build", True)]
    started = [r["eval_key"] for r in after.of_kind("evaluate")]
    assert started.count(finished[0]) == 1  # the finished evaluation was not repeated
    assert len(started) == 3 and started[1] == started[2]  # only the interrupted one ran again
