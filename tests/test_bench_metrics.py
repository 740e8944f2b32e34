"""Suite metrics against hand-computed values, candidate file naming, the clean subset, progress."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from cutegen import bench
from cutegen.errors import ConfigError
from cutegen.records import BenchTaskResult
from cutegen.tasks import load_task, load_tasks

REPO = Path(__file__).resolve().parents[1]


def result(task_id: str, speedup: float | None, compile_speedup: float | None = None, *, level: int | None = 1,
           sol: float | None = None, excluded: tuple[str, ...] = (), sample: int | None = None,
           cost: float = 0.0) -> BenchTaskResult:
    correct = speedup is not None
    return BenchTaskResult(
        task_id=task_id, name=task_id, level=level, problem_id=None, sample_id=sample, compiled=correct,
        correctness=correct, runtime=None, ref_runtime=None, status="done",
        stage_reached="passed" if correct else "correctness", failure=None, median_ms=None, eager_median_ms=1.0,
        compile_median_ms=1.0 if compile_speedup is not None else None, speedup_vs_eager=speedup, speedup_vs_compile=compile_speedup, sol_fraction=sol,
        needs_review=False, degenerate=(), excluded=excluded, candidate_sha256=None, candidate_path=None,
        stop_reason=None, steps=1, rounds=0, llm_calls=2, input_tokens=10, output_tokens=5, cost_usd=cost, gpu_s=1.5)


SUITE = [
    result("level1/1", 0.5, 0.4, sol=0.2),
    result("level1/2", 1.5, 0.9, sol=0.6),
    result("level1/3", 4.0, 3.0, sol=0.9, excluded=("algebraic",)),
    result("level1/4", None),
    result("level2/1", 2.5, None, level=2, cost=0.25),
]


def test_fast_p_counts_correct_and_faster_over_all_tasks():
    assert bench.fast_p(SUITE, 0.0) == pytest.approx(4 / 5)  # fast_0: correct
    assert bench.fast_p(SUITE, 1.0) == pytest.approx(3 / 5)  # 1.5, 4.0, 2.5
    assert bench.fast_p(SUITE, 2.0) == pytest.approx(2 / 5)  # 4.0, 2.5
    assert bench.fast_p(SUITE, 1.0, "compile") == pytest.approx(1 / 5)  # 3.0; level2/1 has no compile baseline
    assert bench.fast_p(SUITE, 2.5) == pytest.approx(1 / 5)  # strictly faster: 2.5 is not > 2.5
    assert bench.fast_p([], 1.0) is None


def test_group_summaries_per_level_and_clean():
    groups = {g.group: g for g in bench.summarize(SUITE)}
    assert list(groups) == ["all", "level1", "level2", "clean", "clean level1", "clean level2"]
    all_ = groups["all"]
    assert (all_.tasks, all_.correct, all_.compiled) == (5, 4, 4)
    assert all_.speedups_eager == 4 and all_.speedups_compile == 3
    assert all_.mean_speedup_eager == pytest.approx((0.5 + 1.5 + 4.0 + 2.5) / 4)
    assert all_.geomean_speedup_eager == pytest.approx((0.5 * 1.5 * 4.0 * 2.5) ** 0.25)
    assert all_.geomean_speedup_compile == pytest.approx((0.4 * 0.9 * 3.0) ** (1 / 3))
    assert all_.median_sol_fraction == pytest.approx(0.6)
    assert all_.cost_usd == pytest.approx(0.25) and all_.llm_calls == 10 and all_.gpu_s == pytest.approx(7.5)
    level1 = groups["level1"]
    assert (level1.tasks, level1.correct, level1.fast_1_eager, level1.fast_2_eager) == (4, 3, 0.5, 0.25)
    clean = groups["clean"]  # level1/3 (algebraic) left out
    assert clean.tasks == 4 and clean.fast_2_eager == pytest.approx(1 / 4)
    assert clean.geomean_speedup_eager == pytest.approx((0.5 * 1.5 * 2.5) ** (1 / 3))
    assert groups["clean level2"].fast_2_eager == 1.0


def test_a_baseline_never_measured_gives_no_fast_p():
    unmeasured = [replace(r, compile_median_ms=None, speedup_vs_compile=None) for r in SUITE]
    summary = bench.group_summary("all", unmeasured)
    assert summary.fast_1_compile is None and summary.geomean_speedup_compile is None
    assert summary.fast_1_eager == pytest.approx(3 / 5)


def test_geomean_and_empty_groups():
    assert bench.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert bench.geomean([]) is None
    empty = bench.group_summary("level9", [])
    assert empty.fast_0 is None and empty.geomean_speedup_eager is None and empty.tasks == 0


def test_summary_counts_each_task_once_by_its_lowest_sample():
    samples = [result("a", None, sample=1, level=None), result("a", 3.0, sample=0, level=None),
               result("b", 1.2, sample=2, level=None)]
    chosen = {r.task_id: r.sample_id for r in bench.primary_results(samples)}
    assert chosen == {"a": 0, "b": 2}
    assert [g.group for g in bench.summarize(samples)] == ["all", "clean"]
    assert bench.summarize(samples)[0].fast_2_eager == pytest.approx(0.5)


def test_known_problems_exclude_suite_tasks_and_probe_flags():
    known = bench.known_problems()
    assert known["level2/66"] == ("degenerate", "stochastic") and known["level3/35"] == ("stochastic",)
    assert {"level1/95", "level2/14", "level2/18", "level1/13"} <= set(known)
    suite_task = replace(load_task(REPO / "examples" / "tasks" / "matmul.py"), task_id="level2/14", level=2,
                         problem_id=14)
    assert bench.exclusions(suite_task, ()) == ("algebraic",)
    assert bench.exclusions(suite_task, ("zeros",)) == ("algebraic", "degenerate")
    plain = load_task(REPO / "examples" / "tasks" / "matmul.py")
    assert bench.exclusions(plain, ()) == ()  # the list names suite tasks only
    assert bench.exclusions(plain, ("constant",)) == ("degenerate",)


def test_candidate_files_are_matched_by_kernelbench_names(tmp_path):
    tasks = load_tasks(REPO / "examples" / "tasks")
    suite_task = replace(tasks[0], task_id="level1/19", name="19_ReLU", level=1, problem_id=19)
    names = ["swish_scale.py", "matmul_sample_3.py", "level_1_problem_19_sample_2_kernel.py", "level1_19.py",
             "notes.py", "level_1_problem_20_sample_0_kernel.py"]
    for name in names:
        (tmp_path / ("sub" if name == "matmul_sample_3.py" else "") / name).parent.mkdir(exist_ok=True)
        (tmp_path / ("sub" if name == "matmul_sample_3.py" else "") / name).write_text("# candidate\n")
    found, unmatched = bench.find_candidates(tasks + [suite_task], tmp_path)
    assert {k: p.name for k, p in found.items()} == {
        ("swish_scale", 0): "swish_scale.py", ("matmul", 3): "matmul_sample_3.py",
        ("level1/19", 2): "level_1_problem_19_sample_2_kernel.py", ("level1/19", 0): "level1_19.py"}
    assert sorted(p.name for p in unmatched) == ["level_1_problem_20_sample_0_kernel.py", "notes.py"]
    (tmp_path / "19_ReLU.py").write_text("# the same sample 0 again\n")
    with pytest.raises(ConfigError, match="Two files hold sample 0 of task level1/19"):
        bench.find_candidates([suite_task], tmp_path)


def test_suite_commit_from_a_source_note(tmp_path):
    assert bench.suite_commit(tmp_path) is None  # no note, not tracked by git
    (tmp_path / "SOURCE.md").write_text("tasks from commit 0123456789abcdef0123456789abcdef01234567\n")
    assert bench.suite_commit(tmp_path) == "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.kernelbench
def test_suite_commit_of_the_kernelbench_copy(kernelbench_root):
    if not (kernelbench_root / "SOURCE.md").is_file():
        pytest.skip("this KernelBench checkout has no SOURCE.md note")
    assert bench.suite_commit(kernelbench_root) == "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"


def test_progress_counts_and_eta():
    class Result:
        def __init__(self, task_id, status, best=None, cost=0.0):
            self.task_id, self.status, self.best_sha256, self.cost_usd, self.gpu_s = task_id, status, best, cost, 2.0

    now = [100.0]
    progress = bench.SuiteProgress(["a", "b", "c", "d", "e"], already_done=["a"], clock=lambda: now[0])
    progress.update(Result("a", "done", "x", 0.5), "done")  # replayed at once: not in the rate
    progress.update(Result("b", "running"), "generate")
    progress.update(Result("c", "running"), "queued")
    assert progress.snapshot().eta_s is None
    now[0] = 160.0
    progress.update(Result("b", "done", "y", 1.0), "done")
    snap = progress.snapshot()
    assert (snap.total, snap.done, snap.running, snap.queued, snap.correct) == (5, 2, 0, 3, 2)
    assert snap.cost_usd == pytest.approx(1.5) and snap.gpu_s == pytest.approx(6.0)
    assert snap.eta_s == pytest.approx(60.0 / 1 * 3)  # one fresh task in 60 s, three to go
    assert math.isclose(snap.elapsed_s, 60.0)


def test_an_evaluate_suite_says_what_is_still_running_when_no_verdict_comes(tmp_path):
    """`on_waiting` hears of the running evaluations after `waiting_s` without a verdict, longest
    first; a verdict resets the wait (no process is started: the executor is a stand-in)."""
    import threading
    import time

    from cutegen.config import EvalConfig
    from cutegen.errors import TaskError

    tasks = load_tasks(Path(__file__).resolve().parents[1] / "examples" / "tasks")
    folder = tmp_path / "candidates"
    folder.mkdir()
    for name in ("swish_scale", "matmul"):
        (folder / f"{name}.py").write_text("class ModelNew:\n    pass\n")
    release = threading.Event()

    class Slow:
        slots, lanes, build_jobs, retries = 2, 1, 1, []

        def evaluate(self, path, task, config, **_):
            if task.task_id == "matmul":
                release.wait(10)
            time.sleep(0.05)
            raise TaskError(f"{task.task_id}: stand-in", "none")

    notes: list[list] = []

    def on_waiting(running):
        notes.append(running)
        release.set()

    results = bench.evaluate_suite(tasks, folder, tmp_path / "run", EvalConfig(device="cpu", backend="torch"),
                                   executor=Slow(),
                                   on_waiting=on_waiting, waiting_s=0.3)
    assert notes and [(task, sample) for task, sample, _ in notes[0]] == [("matmul", 0)]
    assert notes[0][0][2] >= 0.3
    assert {r.task_id for r in results if r.failure} == {"matmul", "swish_scale"}
