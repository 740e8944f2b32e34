"""Suite runs and their KernelBench metrics.

Two ways to fill a suite run, one result format:

- the agent over a suite (`cutegen bench SUITE --model M`): an ordinary agent run (journal.py) over
  many tasks, read back here into per-task results. This module adds no second agent: the results
  are computed from the journal, so they can be recomputed at any time, also for an unfinished run
  or an `optimize` run;
- existing candidate files judged by the same evaluator (`cutegen bench SUITE --evaluate DIR`),
  one ModelNew file per task (and sample), named as KernelBench names them (`find_candidates`).

A suite run directory holds, besides the agent's files (an --evaluate directory has no journal):

    bench.json      the suite (path, commit, task-set hash, selection) and each session's machine
    verdicts.jsonl  (--evaluate) one line per judged candidate, appended and fsynced; a rerun
                    judges only what is not there yet (same candidate, task and settings)
    candidates/     (--evaluate) copies of the judged files, content-addressed
    results.json    per-task results and the suite summary (`write_results`)

Metrics (`summarize`): fast_p is KernelBench's: the fraction of ALL the group's tasks whose kernel is
correct and more than p times faster than the baseline (a task without a kernel, or without a
measured baseline, is not fast); fast_0 is the correct fraction. Mean and geometric mean speedups are
over the correct tasks with a measured speedup (the geometric mean is the one to quote: one 50x task
cannot carry it). Groups: all tasks, each level, and the clean subset, which leaves out the tasks of
`data/kernelbench_known_problems.json` (KernelBench suites only) and every task the evaluator's
trivial-solution probe flagged as degenerate.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

from cutegen.config import AgentConfig, EvalConfig
from cutegen.errors import ConfigError, TaskError
from cutegen.evaluate.executor import LocalExecutor
from cutegen.evaluate.verdict import faster
from cutegen.journal import JOURNAL, Journal, eval_key, load_run as load_agent_run, task_file_name
from cutegen.prompt import measurements
from cutegen.records import (
    EVAL_STAGES, BenchRun, BenchTaskResult, GroupSummary, Step, Task, TrajectoryPoint, Verdict, from_json, to_json,
)
from cutegen.tasks import normalize_source, source_sha256

SCHEMA_VERSION = 1
BENCH_META = "bench.json"
RESULTS = "results.json"
VERDICTS = "verdicts.jsonl"
THROUGHPUT = "throughput.json"
_SAMPLE_FILE = re.compile(r"^(?P<stem>.+)_sample_(?P<sample>\d+)(?:_kernel)?\.py$")
_KERNELBENCH_FILE = re.compile(r"^level_(?P<level>\d+)_problem_(?P<problem>\d+)_sample_(?P<sample>\d+)_kernel\.py$")


# ------------------------------------------------------------------------------ suite identity


@functools.lru_cache(maxsize=1)
def known_problems() -> dict[str, tuple[str, ...]]:
    """KernelBench task id -> the reasons it is left out of the clean subset."""
    text = resources.files("cutegen").joinpath("data/kernelbench_known_problems.json").read_text(encoding="utf-8")
    return {task_id: tuple(reasons) for task_id, reasons in json.loads(text)["tasks"].items()}


def exclusions(task: Task, degenerate: Iterable[str]) -> tuple[str, ...]:
    """Why a task is outside the clean subset: the known-problem list (suite tasks only, whose ids it
    names) and the evaluator's own degenerate-task flag."""
    reasons = list(known_problems().get(task.task_id, ())) if task.level is not None else []
    if tuple(degenerate) and "degenerate" not in reasons:
        reasons.append("degenerate")
    return tuple(reasons)


def suite_commit(path: Path) -> str | None:
    """The suite's commit: the 40-hex commit a SOURCE.md (or README.md) beside the tasks names (a
    vendored copy states its origin), else HEAD of the git checkout that tracks the task files (an
    untracked copy inside another repository would give that repository's commit: not used); None
    when neither says. The task set's own hash (`tasks_sha256`) pins the exact files either way."""
    root = Path(path)
    root = root if root.is_dir() else root.parent
    for name in ("SOURCE.md", "README.md"):
        note = root / name
        if note.is_file():
            found = re.search(r"\b[0-9a-f]{40}\b", note.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found.group(0)
    return _git_head_tracking(root)


def _git_head_tracking(root: Path) -> str | None:
    git = shutil.which("git")
    if git is None:
        return None

    def run(*args: str) -> str | None:
        try:
            out = subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    tracked = run("ls-files", "--", "*.py")
    head = run("rev-parse", "HEAD") if tracked else None
    return head if head and re.fullmatch(r"[0-9a-f]{40}", head) else None


def tasks_sha256(tasks: Iterable[Task]) -> str:
    """One hash for the exact task set: ids and normalised sources."""
    blob = json.dumps(sorted((t.task_id, t.source_sha256) for t in tasks))
    return hashlib.sha256(blob.encode()).hexdigest()


def tolerance_record(config: EvalConfig) -> dict[str, Any]:
    """The tolerances a run judged by (fp32 outputs and half-precision outputs)."""
    atol, rtol = config.tolerance("float32")
    half_atol, half_rtol = config.tolerance("float16")
    return {"track": config.track, "atol": atol, "rtol": rtol, "half_atol": half_atol, "half_rtol": half_rtol}


def write_meta(run_dir: Path, *, kind: str, suite: Path, select: str | None, tasks: list[Task],
               config: EvalConfig, candidates: Path | None = None) -> None:
    """bench.json: written when the run starts; sessions are added by `add_session`."""
    meta = {"schema_version": SCHEMA_VERSION, "kind": kind, "suite": str(suite), "select": select,
            "suite_commit": suite_commit(suite), "tasks_sha256": tasks_sha256(tasks),
            "candidates": str(candidates) if candidates else None, "tolerance": tolerance_record(config),
            "sessions": []}
    _write_json(Path(run_dir) / BENCH_META, meta)


def read_meta(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / BENCH_META
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def add_session(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Record the machine of one session (a split run is evaluated where its GPU sessions ran)."""
    meta = read_meta(run_dir)
    if meta is not None:
        meta["sessions"].append(manifest)
        _write_json(Path(run_dir) / BENCH_META, meta)


def evaluation_machine(meta: dict[str, Any]) -> dict[str, Any]:
    """The manifest of the last session that had a GPU (a split run may end on a machine without
    one, which only writes the results), else of the last session."""
    sessions = meta.get("sessions") or []
    return next((m for m in reversed(sessions) if m.get("gpu_name")), sessions[-1] if sessions else {})


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------ results of a verdict


def _stage_index(verdict: Verdict) -> int:
    return len(EVAL_STAGES) if verdict.passed else EVAL_STAGES.index(verdict.stage) if verdict.stage in EVAL_STAGES else 0


def _compiled(verdict: Verdict) -> bool:
    return verdict.passed or _stage_index(verdict) > EVAL_STAGES.index("build")


def _timing_fields(best: Verdict | None) -> dict[str, Any]:
    """The measured fields of a task's result, from its best (passing) verdict."""
    timing = best.timing if best else None
    eager = best.eager if best else None
    return {
        "runtime": timing.mean_ms * 1000.0 if timing else None,
        "ref_runtime": eager.mean_ms * 1000.0 if eager else None,
        "median_ms": timing.median_ms if timing else None,
        "eager_median_ms": eager.median_ms if eager else None,
        "compile_median_ms": best.compiled.median_ms if best and best.compiled else None,
        "speedup_vs_eager": best.speedup_vs_eager if best else None,
        "speedup_vs_compile": best.speedup_vs_compile if best else None,
        "sol_fraction": best.sol_fraction if best else None,
        "needs_review": bool(best and best.needs_review),
    }


def _furthest(verdicts: list[Verdict]) -> tuple[str, str | None]:
    """(stage reached, its failure) over a task's verdicts: "passed" when one passed."""
    if not verdicts:
        return "no_candidate", None
    furthest = max(reversed(verdicts), key=_stage_index)  # the latest among equals
    return ("passed", None) if furthest.passed else (furthest.stage, furthest.failure)


def result_from_verdict(task: Task, verdict: Verdict | None, *, sample_id: int | None, candidate_path: str | None,
                        status: str = "done", failure: str | None = None) -> BenchTaskResult:
    """One judged candidate file as a task result (--evaluate)."""
    verdicts = [verdict] if verdict is not None else []
    stage, failed = _furthest(verdicts)
    if verdict is None:
        stage = "missing" if status == "missing" else "task_error"
    best = verdict if verdict is not None and verdict.passed else None
    degenerate = verdict.degenerate if verdict is not None else ()
    return BenchTaskResult(
        task_id=task.task_id, name=task.name, level=task.level, problem_id=task.problem_id, sample_id=sample_id,
        compiled=any(_compiled(v) for v in verdicts), correctness=best is not None, status=status,
        stage_reached=stage, failure=failed or failure, **_timing_fields(best), degenerate=tuple(degenerate),
        excluded=exclusions(task, degenerate), candidate_sha256=verdict.candidate_sha256 if verdict else None,
        candidate_path=candidate_path, stop_reason=None, steps=len(verdicts), rounds=0, llm_calls=0,
        input_tokens=0, output_tokens=0, cost_usd=0.0, gpu_s=(verdict.gpu_s or 0.0) if verdict else 0.0,
    )


# ------------------------------------------------------------------------------ results of an agent run


def best_flags(steps: list[Step], min_gain: float) -> list[bool]:
    """Which steps became the task's best, as the agent decided it: passing candidates in step order,
    each taking over when faster than the best so far by the required gain (evaluate.verdict.faster). Steps of a
    batch may each be `improved` (faster than the best the batch started from); one wins."""

    flags, best = [], None
    for step in steps:
        passed = step.verdict is not None and step.verdict.passed
        wins = passed and (best is None or faster(step.verdict, best, min_gain))
        flags.append(wins)
        best = step.verdict if wins else best
    return flags


def spending(journal: Any, task_id: str) -> dict[int, tuple[int, float]]:
    """(model calls, GPU seconds) the task had spent when each of its steps was recorded, by step
    index: calls of any stage (directions too) and the GPU time of evaluations and profiles so far."""
    calls, gpu, spent, judged = 0, 0.0, {}, set()
    for record in journal.records:
        if record.get("task_id") != task_id:
            continue
        if record["kind"] == "reply":
            calls += 1
        elif record["kind"] == "profile":
            gpu += record.get("gpu_s") or 0.0
        elif record["kind"] == "step":
            if record.get("eval_key") not in judged:  # a repeated candidate reuses its verdict
                gpu += (record.get("verdict") or {}).get("gpu_s") or 0.0
                judged.add(record.get("eval_key"))
            spent[record["index"]] = (calls, round(gpu, 3))
    return spent


def trajectory(steps: list[Step], min_gain: float = AgentConfig.min_gain,
               spent: dict[int, tuple[int, float]] | None = None) -> tuple[TrajectoryPoint, ...]:
    """Speedup by step, with the best kernel's speedup after each step, the search tree (each step's
    candidate and parent) and what had been spent when it was recorded."""
    points, best = [], None
    for step, became_best in zip(steps, best_flags(steps, min_gain)):
        verdict = step.verdict
        passed = verdict is not None and verdict.passed
        speedup = verdict.speedup_vs_eager if passed else None
        if became_best:
            best = speedup
        if step.bad_reply is not None or verdict is None:
            outcome = "unusable reply"
        elif passed:
            outcome = "passed"
        else:
            outcome = f"failed at {verdict.stage}" + (f": {verdict.failure}" if verdict.failure else "")
        calls, gpu = (spent or {}).get(step.index, (None, None))
        points.append(TrajectoryPoint(index=step.index, stage=step.stage, round=step.round, passed=passed,
                                      speedup_vs_eager=speedup, best_speedup_vs_eager=best,
                                      profile_shown=step.profile_shown, improved=became_best, outcome=outcome,
                                      candidate_sha256=step.candidate_sha256, parent_sha256=step.parent_sha256,
                                      idea=step.idea, llm_calls=calls, gpu_s=gpu))
    return tuple(points)


def search_tree(points: tuple[TrajectoryPoint, ...]) -> list[tuple[int, TrajectoryPoint]]:
    """The steps as a tree, depth first, as (depth, point): a step hangs under the first step that
    gave its parent candidate (an optimization under the kernel it started from, a repair under the
    candidate it fixes); generations are roots."""
    first_of: dict[str, int] = {}
    for p in points:
        if p.candidate_sha256 and p.candidate_sha256 not in first_of:
            first_of[p.candidate_sha256] = p.index
    children: dict[int | None, list[TrajectoryPoint]] = {}
    for p in points:
        parent = first_of.get(p.parent_sha256) if p.parent_sha256 else None
        children.setdefault(parent if parent != p.index else None, []).append(p)
    ordered: list[tuple[int, TrajectoryPoint]] = []

    def walk(key: int | None, depth: int) -> None:
        for child in children.get(key, []):
            ordered.append((depth, child))
            walk(child.index, depth + 1)

    walk(None, 0)
    return ordered


def budget_curve(points: tuple[TrajectoryPoint, ...], field: str) -> list[tuple[float, float]]:
    """(spent, best speedup vs eager reached) each time the best improved, `field` being "llm_calls" or
    "gpu_s"; [] when the run did not record spending."""
    timed = sorted((getattr(p, field), p.speedup_vs_eager) for p in points
                   if p.improved and p.speedup_vs_eager and getattr(p, field) is not None)
    curve: list[tuple[float, float]] = []
    for spent, speedup in timed:
        if not curve or speedup > curve[-1][1]:
            curve.append((float(spent), speedup))
    return curve


def agent_task_result(journal: Any, task: Task) -> BenchTaskResult:
    """One task of an agent run: its best kernel (the fold of `best_flags`), how far its candidates
    got, what it cost, and its trajectory."""
    steps = journal.steps(task.task_id)
    min_gain = float(journal.run_record()["agent"].get("min_gain", AgentConfig.min_gain))
    verdicts = [s.verdict for s in steps if s.verdict is not None]
    best_step = next((s for s, won in reversed(list(zip(steps, best_flags(steps, min_gain)))) if won), None)
    best = best_step.verdict if best_step else None
    stage, failure = _furthest(verdicts)
    if not steps:
        stage = "not_started"
    end = journal.task_end(task.task_id)
    spent = journal.totals(task.task_id)
    degenerate = tuple(dict.fromkeys(d for v in verdicts for d in v.degenerate))
    return BenchTaskResult(
        task_id=task.task_id, name=task.name, level=task.level, problem_id=task.problem_id, sample_id=None,
        compiled=any(_compiled(v) for v in verdicts), correctness=best is not None,
        status="done" if end is not None else "unfinished", stage_reached=stage, failure=failure,
        **_timing_fields(best), degenerate=degenerate, excluded=exclusions(task, degenerate),
        candidate_sha256=best_step.candidate_sha256 if best_step else None,
        candidate_path=best_step.candidate_path if best_step else None,
        stop_reason=end.get("reason") if end else None, steps=len(steps), rounds=max((s.round for s in steps), default=0),
        llm_calls=int(spent["llm_calls"]), input_tokens=int(spent["input_tokens"]),
        output_tokens=int(spent["output_tokens"]), cost_usd=float(spent["cost_usd"]), gpu_s=float(spent["gpu_s"]),
        trajectory=trajectory(steps, min_gain, spending(journal, task.task_id)),
    )


def agent_results(run_dir: Path) -> list[BenchTaskResult]:
    """Every task of an agent run directory, in the run's task order."""
    journal = Journal.open(run_dir)
    return [agent_task_result(journal, task) for task in load_agent_run(journal).tasks]


# ------------------------------------------------------------------------------ metrics


def fast_p(results: list[BenchTaskResult], p: float, baseline: str = "eager") -> float | None:
    """KernelBench fast_p: correct and speedup > p, over all the given tasks (None when none)."""
    if not results:
        return None
    if p <= 0:
        return sum(r.correctness for r in results) / len(results)
    field = "speedup_vs_eager" if baseline == "eager" else "speedup_vs_compile"
    fast = [r for r in results if r.correctness and getattr(r, field) is not None and getattr(r, field) > p]
    return len(fast) / len(results)


def geomean(values: list[float]) -> float | None:
    positive = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in positive) / len(positive)) if positive else None


def _means(results: list[BenchTaskResult], field: str) -> tuple[int, float | None, float | None]:
    values = [getattr(r, field) for r in results if r.correctness and getattr(r, field) is not None]
    if not values:
        return 0, None, None
    return len(values), statistics.fmean(values), geomean(values)


def group_summary(group: str, results: list[BenchTaskResult]) -> GroupSummary:
    n_eager, mean_eager, geo_eager = _means(results, "speedup_vs_eager")
    n_compile, mean_compile, geo_compile = _means(results, "speedup_vs_compile")
    sol = [r.sol_fraction for r in results if r.correctness and r.sol_fraction is not None]
    # A baseline the run never measured (e.g. --no-compile-baseline) gives no fast_p, not 0%.
    eager = any(r.eager_median_ms is not None for r in results)
    compiled = any(r.compile_median_ms is not None for r in results)
    return GroupSummary(
        group=group, tasks=len(results), compiled=sum(r.compiled for r in results),
        correct=sum(r.correctness for r in results), fast_0=fast_p(results, 0.0),
        fast_1_eager=fast_p(results, 1.0, "eager") if eager else None,
        fast_2_eager=fast_p(results, 2.0, "eager") if eager else None,
        fast_1_compile=fast_p(results, 1.0, "compile") if compiled else None,
        fast_2_compile=fast_p(results, 2.0, "compile") if compiled else None,
        speedups_eager=n_eager, mean_speedup_eager=mean_eager, geomean_speedup_eager=geo_eager,
        speedups_compile=n_compile, mean_speedup_compile=mean_compile, geomean_speedup_compile=geo_compile,
        median_sol_fraction=statistics.median(sol) if sol else None,
        llm_calls=sum(r.llm_calls for r in results), cost_usd=sum(r.cost_usd for r in results),
        gpu_s=sum(r.gpu_s for r in results),
    )


def primary_results(results: Iterable[BenchTaskResult]) -> list[BenchTaskResult]:
    """One result per task for the summary: its lowest sample id (an agent run has one per task)."""
    chosen: dict[str, BenchTaskResult] = {}
    for result in results:
        held = chosen.get(result.task_id)
        if held is None or (result.sample_id or 0) < (held.sample_id or 0):
            chosen[result.task_id] = result
    return list(chosen.values())


def summarize(results: Iterable[BenchTaskResult]) -> list[GroupSummary]:
    """All tasks, each level, the clean subset (and each level of it when there are several)."""
    tasks = primary_results(results)
    levels = sorted({r.level for r in tasks if r.level is not None})
    clean = [r for r in tasks if not r.excluded]
    groups = [group_summary("all", tasks)]
    groups += [group_summary(f"level{lv}", [r for r in tasks if r.level == lv]) for lv in levels]
    groups.append(group_summary("clean", clean))
    if len(levels) > 1:
        groups += [group_summary(f"clean level{lv}", [r for r in clean if r.level == lv]) for lv in levels]
    return groups


# ------------------------------------------------------------------------------ results.json


def write_results(run_dir: Path, results: list[BenchTaskResult], *, kind: str, model: str | None = None,
                  recorded: bool = False, agent: dict | None = None, evaluation: dict | None = None,
                  manifest: dict | None = None) -> Path:
    """results.json: the run, its settings, the machine, the summary and every task's result."""
    meta = read_meta(run_dir) or {}
    data = {
        "schema_version": SCHEMA_VERSION, "run_id": Path(run_dir).name, "kind": kind, "model": model,
        "recorded": recorded, "suite": meta.get("suite"), "suite_commit": meta.get("suite_commit"),
        "tasks_sha256": meta.get("tasks_sha256", ""), "agent": agent or {}, "evaluation": evaluation or {},
        "tolerance": meta.get("tolerance") or {}, "manifest": manifest or evaluation_machine(meta),
        "summary": to_json(summarize(results)), "results": to_json(results),
    }
    path = Path(run_dir) / RESULTS
    _write_json(path, data)
    return path


def load_run(path: Path) -> BenchRun:
    """A suite run for reports: recomputed from the journal of an agent run (so an unfinished or an
    `optimize` run works too), read from results.json otherwise."""

    path = Path(path)
    if (path / JOURNAL).is_file():
        return _agent_run(path)
    if not (path / RESULTS).is_file():
        raise ConfigError(f"{path} is neither a cutegen run directory nor a bench result directory"
                          f" (no journal.jsonl, no {RESULTS}).",
                          "Pass a folder made by `cutegen bench`, `cutegen optimize` or `cutegen bench --evaluate`.")
    data = json.loads((path / RESULTS).read_text(encoding="utf-8"))
    results = tuple(from_json(BenchTaskResult, r) for r in data["results"])
    return BenchRun(run_id=data["run_id"], kind=data["kind"], path=path, model=data.get("model"),
                    recorded=bool(data.get("recorded")), suite=data.get("suite"), suite_commit=data.get("suite_commit"),
                    tasks_sha256=data.get("tasks_sha256", ""), agent=data.get("agent") or {},
                    evaluation=data.get("evaluation") or {}, tolerance=data.get("tolerance") or {},
                    manifest=data.get("manifest") or {}, results=results, summary=tuple(summarize(results)))


def _agent_run(path: Path) -> BenchRun:
    journal = Journal.open(path)
    setup = load_agent_run(journal)
    results = tuple(agent_task_result(journal, task) for task in setup.tasks)
    meta = read_meta(path) or {}
    recorded = any((r.get("reply") or {}).get("recorded") for r in journal.of_kind("reply"))
    return BenchRun(run_id=setup.run_id, kind="agent", path=path, model=setup.model, recorded=recorded,
                    suite=meta.get("suite"), suite_commit=meta.get("suite_commit"),
                    tasks_sha256=meta.get("tasks_sha256") or tasks_sha256(setup.tasks), agent=setup.agent,
                    evaluation=setup.evaluation, tolerance=meta.get("tolerance") or {},
                    manifest=evaluation_machine(meta), results=results, summary=tuple(summarize(results)))


# ------------------------------------------------------------------------------ --evaluate


def _sample_of(name: str, task: Task) -> int | None:
    """The sample id a candidate file name gives for `task`, or None when it names another task.

    Accepted names: `<task file stem>.py` (sample 0: the task file's own name, e.g. 19_ReLU.py), the
    name a run directory's best/ folder uses (`level1_19.py`, sample 0), `<stem>_sample_<S>.py`, and
    for suite tasks KernelBench's generation naming `level_<L>_problem_<P>_sample_<S>_kernel.py`.
    """

    if name in (f"{task.name}.py", f"{task_file_name(task.task_id)}.py"):
        return 0
    match = _KERNELBENCH_FILE.match(name)
    if match and task.level is not None:
        if (int(match["level"]), int(match["problem"])) == (task.level, task.problem_id):
            return int(match["sample"])
        return None
    match = _SAMPLE_FILE.match(name)
    return int(match["sample"]) if match and match["stem"] == task.name else None


def find_candidates(tasks: list[Task], folder: Path) -> tuple[dict[tuple[str, int], Path], list[Path]]:
    """{(task id, sample id): file} for every candidate file under `folder`, and the files that name no
    task. Two files for the same task and sample are an error (which one was meant is unknowable)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"Candidate folder {folder} does not exist.",
                          "Pass a folder of ModelNew files named after their tasks (e.g. 19_ReLU.py or"
                          " level_1_problem_19_sample_0_kernel.py).")
    found: dict[tuple[str, int], Path] = {}
    unmatched = []
    for path in sorted(folder.rglob("*.py")):
        hits = [(task.task_id, sample) for task in tasks if (sample := _sample_of(path.name, task)) is not None]
        if not hits:
            unmatched.append(path)
        for key in hits:
            if key in found:
                raise ConfigError(f"Two files hold sample {key[1]} of task {key[0]}: {found[key]} and {path}.",
                                  "Keep one file per task and sample in the candidate folder.")
            found[key] = path
    return found, unmatched


@dataclass(frozen=True)
class _Job:
    task: Task
    sample: int
    source_path: Path  # the user's file
    copy_path: str  # candidates/<sha>.py inside the output directory
    sha256: str
    key: str  # journal.eval_key of (candidate, task, settings)


class _VerdictLog:
    """verdicts.jsonl: the finished evaluations of an --evaluate directory, appended and fsynced."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / VERDICTS
        self.lock = threading.Lock()
        self.done: dict[str, dict] = {}
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:  # a torn last line of a killed run: judged again
                    continue
                record["verdict"] = from_json(Verdict, record["verdict"]) if record.get("verdict") else None
                self.done[record["key"]] = record

    def add(self, job: _Job, verdict: Verdict | None, task_error: str | None) -> dict:
        record = {"key": job.key, "task_id": job.task.task_id, "sample_id": job.sample, "candidate_sha256": job.sha256,
                  "candidate_path": job.copy_path, "verdict": to_json(verdict) if verdict else None,
                  "task_error": task_error}
        with self.lock:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            self.done[job.key] = {**record, "verdict": verdict}
        return self.done[job.key]


def _jobs(tasks: list[Task], found: dict[tuple[str, int], Path], out_dir: Path, config: EvalConfig) -> list[_Job]:
    by_id = {t.task_id: t for t in tasks}
    jobs = []
    for (task_id, sample), path in sorted(found.items()):
        source = path.read_text(encoding="utf-8", errors="replace")
        sha = source_sha256(source)
        copy = Path(out_dir) / "candidates" / f"{sha}.py"
        copy.parent.mkdir(parents=True, exist_ok=True)
        if not copy.exists():
            copy.write_text(normalize_source(source), encoding="utf-8")
        task = by_id[task_id]
        jobs.append(_Job(task, sample, path, f"candidates/{sha}.py", sha, eval_key(sha, task.source_sha256, config)))
    return jobs


EvaluateProgress = Callable[[BenchTaskResult, int, int, "Verdict | None"], None]  # (result, finished, total, verdict)
# (task id, sample, seconds since its evaluation began) of each evaluation still running
EvaluateWaiting = Callable[[list[tuple[str, "int | None", float]]], None]
WAITING_NOTE_S = 60.0  # `on_waiting` hears of the running evaluations after this long without a verdict


def evaluate_suite(tasks: list[Task], folder: Path, out_dir: Path, config: EvalConfig, *,
                   on_result: EvaluateProgress | None = None, build_jobs: int | None = None,
                   executor: Any = None, on_waiting: EvaluateWaiting | None = None,
                   waiting_s: float = WAITING_NOTE_S) -> list[BenchTaskResult]:
    """Judge every candidate file in `folder` against its task with `evaluate_candidate` and return a
    result per (task, sample) plus a "missing" result per task without a file. Resumable:
    verdicts.jsonl keeps what is finished.

    One executor for the suite (evaluate/executor.py; None: this machine's evaluation service, made
    and closed here): candidates build in its CPU pool (`build_jobs` at once; default: the cores the
    GPU lanes leave) while others are measured, one at a time per GPU (config.gpus, or one per actor
    of a Ray executor); a task's reference work is done once per GPU and serves all its samples there.
    Candidates are taken task by task, so a task's samples follow each other on a lane. Only this
    process writes verdicts.jsonl. Writes throughput.json: this session's evaluations per minute,
    where their seconds went and how many were sent again (`throughput_summary`). `on_waiting` hears
    of the evaluations still running each time `waiting_s` pass without a verdict (a log that says
    nothing for minutes looks like a hang).
    """

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    found, _ = find_candidates(tasks, folder)
    log = _VerdictLog(out_dir)
    jobs = _jobs(tasks, found, out_dir, config)
    todo = [job for job in jobs if job.key not in log.done]
    finished = [0]

    def judged(record: dict, job: _Job) -> None:
        finished[0] += 1
        if on_result is not None:
            on_result(_record_result(job.task, record), finished[0], len(jobs), record.get("verdict"))

    for job in jobs:
        if job.key in log.done:
            judged(log.done[job.key], job)
    if not todo:
        return _collect(tasks, jobs, log)
    started = time.perf_counter()
    own = executor is None
    executor = LocalExecutor(config, build_jobs=build_jobs) if own else executor
    retried = len(executor.retries)  # a caller's executor may have served other runs
    try:
        _judge_all(todo, out_dir, config, executor, log, judged, on_waiting, waiting_s)
    finally:
        if own:
            executor.close()
    verdicts = [log.done[job.key].get("verdict") for job in todo]
    summary = throughput_summary([v for v in verdicts if v is not None], time.perf_counter() - started,
                                 lanes=executor.lanes, build_jobs=executor.build_jobs,
                                 retries=len(executor.retries) - retried)
    _write_json(out_dir / THROUGHPUT, summary)
    return _collect(tasks, jobs, log)


def throughput_summary(verdicts: list[Verdict], wall_s: float, *, lanes: int, build_jobs: int,
                       retries: int = 0) -> dict[str, Any]:
    """How fast a set of evaluations went, from the verdicts' own records (Verdict.gpu_s: seconds a
    GPU lane was held; Verdict.stage_s: where they went).

    - `per_gpu_minute`: evaluations per minute of wall time per GPU lane, builds included (they
      overlap the GPU work), the figure a run's length follows;
    - `built`: evaluations of a candidate that built, on a lane where the task's reference was
      ready (no reference step): the median and 90th percentile of their GPU seconds;
    - `first`: a task's first evaluation on a lane (its reference process started, its baselines
      looked up or measured): the median of its GPU seconds and of the reference and baselines steps;
    - `stage_median_s`: the median seconds of each step over the evaluations that ran it;
    - `retries`: evaluations sent again because the process or node running them died (a Ray
      executor's; each still gave one verdict).
    """
    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    def p90(values: list[float]) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)], 3)

    steps = [dict(v.stage_s) for v in verdicts]
    first = [v for v, st in zip(verdicts, steps) if "reference" in st]
    built = [v for v, st in zip(verdicts, steps) if "reference" not in st and "setup" in st]
    names: list[str] = []
    for st in steps:
        names += [n for n in st if n not in names]
    return {
        "evaluations": len(verdicts), "wall_s": round(wall_s, 3), "lanes": lanes, "build_jobs": build_jobs,
        "per_gpu_minute": round(len(verdicts) / (wall_s / 60.0) / max(1, lanes), 3) if wall_s > 0 else None,
        "gpu_s_total": round(sum(v.gpu_s or 0.0 for v in verdicts), 3),
        "median_gpu_s": median([v.gpu_s or 0.0 for v in verdicts]),
        "built": {"count": len(built), "median_gpu_s": median([v.gpu_s or 0.0 for v in built]),
                  "p90_gpu_s": p90([v.gpu_s or 0.0 for v in built])},
        "first": {"count": len(first), "median_gpu_s": median([v.gpu_s or 0.0 for v in first]),
                  "median_reference_s": median([dict(v.stage_s).get("reference", 0.0) for v in first]),
                  "median_baselines_s": median([dict(v.stage_s).get("baselines", 0.0) for v in first])},
        "stage_median_s": {n: median([st[n] for st in steps if n in st]) for n in names},
        "retries": retries,
    }


def _judge_all(todo: list[_Job], out_dir: Path, config: EvalConfig, executor: Any, log: _VerdictLog,
               judged: Callable[[dict, _Job], None], on_waiting: EvaluateWaiting | None = None,
               waiting_s: float = WAITING_NOTE_S) -> None:
    """Every job through the executor, as many at once as it has slots; `judged` as each ends (in
    the order they end), `on_waiting` after each `waiting_s` without one."""
    running: dict[str, float] = {}  # job key -> when its evaluation began (time.monotonic())
    with ThreadPoolExecutor(max_workers=executor.slots) as threads:
        futures = {threads.submit(_judge, job, out_dir, config, executor, log, running): job for job in todo}
        pending, order = set(futures), {future: k for k, future in enumerate(futures)}
        try:
            while pending:
                done, pending = wait(pending, timeout=waiting_s if on_waiting else None, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: order[f]):  # several can end at once
                    judged(future.result(), futures[future])
                if not done and on_waiting is not None:
                    now = time.monotonic()
                    jobs = sorted((job for job in todo if job.key in running), key=lambda j: running.get(j.key, now))
                    on_waiting([(job.task.task_id, job.sample, now - running.get(job.key, now)) for job in jobs])
        except BaseException:  # a broken toolchain or an interrupt: start nothing more
            for future in futures:
                future.cancel()
            raise


def _judge(job: _Job, out_dir: Path, config: EvalConfig, executor: Any, log: _VerdictLog,
           running: dict[str, float]) -> dict:
    running[job.key] = time.monotonic()
    try:
        verdict = executor.evaluate(out_dir / job.copy_path, job.task, config)
    except TaskError as err:  # the reference is broken: the task's problem, not the candidate's
        return log.add(job, None, err.problem)
    finally:
        running.pop(job.key, None)
    return log.add(job, verdict, None)


def _record_result(task: Task, record: dict) -> BenchTaskResult:
    return result_from_verdict(task, record.get("verdict"), sample_id=record["sample_id"],
                               candidate_path=record["candidate_path"], failure=record.get("task_error"))


def _collect(tasks: list[Task], jobs: list[_Job], log: _VerdictLog) -> list[BenchTaskResult]:
    by_task: dict[str, list[BenchTaskResult]] = {}
    for job in jobs:
        by_task.setdefault(job.task.task_id, []).append(_record_result(job.task, log.done[job.key]))
    results = []
    for task in tasks:
        judged = sorted(by_task.get(task.task_id, []), key=lambda r: r.sample_id or 0)
        results += judged or [result_from_verdict(task, None, sample_id=None, candidate_path=None, status="missing")]
    return results


# ------------------------------------------------------------------------------ progress


@dataclass(frozen=True)
class ProgressSnapshot:
    """Where a suite run stands: tasks done, running and queued, spend so far, and an estimate."""

    total: int
    done: int
    running: int
    queued: int
    correct: int
    cost_usd: float
    gpu_s: float
    elapsed_s: float
    eta_s: float | None  # None until a task has finished in this session


def step_line(task_id: str, label: str, verdict: Verdict | None, note: str | None = None) -> str:
    """One line for a log about one finished step or evaluation: task, stage, verdict, speedups and
    the seconds of each evaluation step (the GPU lane's and the build's)."""

    if verdict is None:
        return f"{task_id} {label}: {note or 'no verdict'}"
    if verdict.passed:
        outcome = "passed, " + measurements(verdict).rstrip(".")
    else:
        outcome = f"failed at {verdict.stage}: {verdict.failure}"
    seconds = " ".join(f"{step} {value:.1f}" for step, value in verdict.stage_s if value >= 0.05)
    gpu = f"GPU {verdict.gpu_s:.1f} s" if verdict.gpu_s else "no GPU"
    return f"{task_id} {label}: {outcome} | {gpu} | s: {seconds}"


def task_end_line(result: Any) -> str:
    """One line for a log about a task the agent stopped (a TaskResult): why, its best kernel, what it cost."""
    best = []
    if result.best_median_ms is not None:
        best.append(f"median {result.best_median_ms:.4g} ms")
    if result.speedup_vs_eager is not None:
        best.append(f"{result.speedup_vs_eager:.3g}x eager PyTorch")
    if result.speedup_vs_compile is not None:
        best.append(f"{result.speedup_vs_compile:.3g}x torch.compile")
    if result.sol_fraction is not None:
        best.append(f"{result.sol_fraction:.1%} of the reference algorithm's work bound")
    kernel = "best kernel: " + ", ".join(best) if best else "no correct kernel" if result.best_sha256 is None \
        else "best kernel not timed"
    return (f"{result.task_id} {result.status}: {result.stop_reason or 'stopped'} | {kernel} | GPU {result.gpu_s:.1f} s"
            f" | {result.steps} steps, {result.llm_calls} model calls, ${result.cost_usd:.4f}")


class SuiteProgress:
    """Folds the agent's per-task progress callbacks into suite-wide counts and an ETA.

    The ETA assumes the remaining tasks take as long as the ones this session finished so far (tasks
    that were already done when the session started are left out of that rate: a resumed run replays
    them in moments).
    """

    def __init__(self, task_ids: list[str], already_done: Iterable[str] = (), clock: Callable[[], float] = time.monotonic):
        self.task_ids = list(task_ids)
        self.already_done = set(already_done)
        self.clock = clock
        self.started = clock()
        self.state: dict[str, tuple[Any, str]] = {}

    def update(self, result: Any, activity: str) -> None:
        self.state[result.task_id] = (result, activity)

    def snapshot(self) -> ProgressSnapshot:
        results = [r for r, _ in self.state.values()]
        done = [r for r in results if r.status == "done"]
        running = [r for r, activity in self.state.values() if r.status != "done" and activity != "queued"]
        elapsed = self.clock() - self.started
        fresh = len([r for r in done if r.task_id not in self.already_done])
        remaining = len(self.task_ids) - len(done)
        eta = elapsed / fresh * remaining if fresh else None
        return ProgressSnapshot(
            total=len(self.task_ids), done=len(done), running=len(running),
            queued=len(self.task_ids) - len(done) - len(running),
            correct=sum(1 for r in results if r.best_sha256 is not None),
            cost_usd=sum(r.cost_usd for r in results), gpu_s=sum(r.gpu_s for r in results),
            elapsed_s=elapsed, eta_s=eta,
        )
