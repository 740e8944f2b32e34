"""The survey's measuring loop: chunks of (task, track)s precompiled in parallel, then measured one at
a time in one worker (so nothing else uses the device while something is timed), each task probed once
beside the precompile, when nothing is timed.

A task or track is not started when less of the budget is left than 1.5 times the median seconds of
the (task, track)s this run did (at least 10 s); what is left is counted in the file's summary, for the
next call.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from cutegen.config import EvalConfig
from cutegen.evaluate.baselines import BaselineWorker
from cutegen.evaluate.cache import save_json
from cutegen.evaluate.sol import get_peaks, load_peaks, peaks_path
from cutegen.evaluate.worker import WorkerPool
from cutegen.records import Peaks, Task, to_json
import cutegen.survey.measure as m
from cutegen.survey.markdown import markdown
from cutegen.survey.table import Wanted, check_device, load_state, merge_states, plan, summarize, task_entry, \
    write_state

MIN_TASK_S = 10.0  # the per-(task, track) estimate before this run has measured any, and its floor
ESTIMATE_FACTOR = 1.5


@dataclass(frozen=True)
class SurveyConfig:
    """One survey call. `evaluation` carries device, GPU, timing trials, caches and toolchain (its
    track is set per track); `out` is the JSON file written (the .md beside it), `state` an earlier
    file to resume from (None: only `out` itself); `inductor_dir` is where the caller pointed
    TORCHINDUCTOR_CACHE_DIR before any worker started."""

    out: Path
    evaluation: EvalConfig
    inductor_dir: Path
    wanted: Wanted = Wanted()
    state: Path | None = None
    budget_s: float = 530.0
    compile_jobs: int = 1
    chunk: int = 2
    settings: dict[str, Any] = field(default_factory=dict)  # recorded with the run, as given


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def suite_info(root: Path) -> dict[str, Any]:
    """The task set's name and commit (from SOURCE.md when the copy has one): no local path."""
    source = root / "SOURCE.md"
    match = re.search(r"commit\s+([0-9a-f]{7,40})", source.read_text()) if source.is_file() else None
    return {"folder": root.name, "commit": match.group(1) if match else None}


def new_run(config: SurveyConfig, manifest: dict[str, Any]) -> dict[str, Any]:
    """This run's record: the machine manifest, the settings, and (filled in as it goes) what it added."""
    started = now_utc()
    return {"id": f"{started}-{os.getpid()}", "started_utc": started, "manifest": manifest,
            "device": config.evaluation.device, "added": [], "settings": config.settings}


def open_state(config: SurveyConfig, suite: Path) -> dict[str, Any]:
    """The earlier results: the --state file and `out` itself (a run that was killed), merged."""
    state = merge_states(load_state(config.state), load_state(config.out))
    state["kernelbench"] = suite_info(suite)
    return state


class Runner:
    """The measuring loop over chunks: precompile a chunk in parallel, then measure it serially."""

    def __init__(self, config: SurveyConfig, state: dict[str, Any], tasks: list[Task], run: dict[str, Any],
                 log: Callable[[str], None] = lambda line: None) -> None:
        self.config, self.state, self.tasks, self.run, self.log = config, state, tasks, run, log
        self.configs = {track: replace(config.evaluation, track=track) for track in config.wanted.tracks}
        self.deadline = time.monotonic() + config.budget_s
        self.unit_s: list[float] = []  # seconds per (task, track) of this run, the precompile's share included
        self.pool: Any = None
        self.held: Any = None  # the measuring worker, kept from task to task
        self.precompiler: Any = None
        self.peaks: Peaks | None = None
        self.probe_ok = config.wanted.probe
        self.traces: dict[str, Any] = {}  # task id -> TaskTrace, or why it failed
        self.done, self.total = 0, 0

    def estimate_s(self) -> float:
        return max(MIN_TASK_S, ESTIMATE_FACTOR * statistics.median(self.unit_s)) if self.unit_s else MIN_TASK_S

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        left = len(plan(self.tasks, self.state, self.config.wanted))
        write_state(self.config.out, self.state, self.run, left, markdown)

    def add(self, task: Task, key: str, value: dict[str, Any]) -> None:
        entry = task_entry(self.state, task)
        before = entry["probe"] if key == "probe" else entry["tracks"].get(key)
        if "error" in value:
            value["attempts"] = (before or {}).get("attempts", 1) + 1 if before and "error" in before else 1
        if key == "probe":
            entry["probe"] = value
        else:
            entry["tracks"][key] = {**value, "measured_utc": now_utc(), "run": self.run["id"]}
        self.run["added"].append(f"{task.task_id}:{key}")
        self.save()

    def execute(self, todo: list[tuple[Task, list[str], bool]]) -> None:
        self.total = sum(len(tracks) for _, tracks, _ in todo)
        first = self.configs[self.config.wanted.tracks[0]]
        # No kernel audit here. One worker measures task after task; its spare, which takes over when it
        # dies, imports torch.compile's machinery while it waits.
        compile_baseline = self.config.wanted.compile_baseline
        with WorkerPool.for_config(first, warm_profiler=False, warm_compile=compile_baseline) as self.pool, \
                BaselineWorker(self.pool) as self.held, \
                m.Precompiler(self.configs, self.config.compile_jobs, self.config.inductor_dir) as self.precompiler:
            info = self.pool.info()
            check_device(self.state, info)
            self.peaks = self.load_peaks(first, info) or get_peaks(first.cache_dir, self.pool, first.run_timeout_s)
            self.run["peaks"] = None if self.peaks is None else to_json(self.peaks)
            if self.peaks is not None:
                self.state["peaks"] = {**self.state["device"], "peaks": to_json(self.peaks)}
            self.held.take()  # now, so that the spare replacing it starts during the first precompile
            pending = list(todo)
            while pending:
                chunk = self.next_chunk(pending)
                if not chunk or not self.chunk(chunk):
                    break
                del pending[:len(chunk)]

    def load_peaks(self, config: EvalConfig, info: dict[str, Any]) -> Peaks | None:
        """The peaks of an earlier run on the same device and torch: one set of bounds for the table."""
        saved = self.state.get("peaks") or {}
        if config.device != "cuda" or saved.get("device_name") != info["device_name"] \
                or saved.get("torch_version") != info["torch_version"]:
            return None
        path = peaks_path(config.cache_dir, info["device_name"], info["torch_version"])
        save_json(path, saved["peaks"])
        return load_peaks(path)

    def next_chunk(self, pending: list[tuple[Task, list[str], bool]]) -> list[tuple[Task, list[str], bool]]:
        """The next tasks, about `chunk` (task, track)s, a task's tracks together, as many as the budget
        left can measure at the current estimate (only those are precompiled)."""
        fits = min(self.config.chunk, int(self.left_s() // self.estimate_s()))
        chunk, units = [], 0
        for item in pending:
            units += max(1, len(item[1]))
            if units > fits:
                break
            chunk.append(item)
        return chunk

    def chunk(self, chunk: list[tuple[Task, list[str], bool]]) -> bool:
        """Precompile one chunk and probe its tasks meanwhile (nothing is timed then), then measure it
        serially; False when the budget ran out."""
        started = time.perf_counter()
        for task, tracks, _ in chunk:
            if tracks and task.task_id not in self.traces:
                self.traces[task.task_id] = m.trace_of(task)
        units = [(t, k) for t, tracks, _ in chunk for k in tracks]
        warm: dict[tuple[str, str], dict[str, Any]] = {}
        with ThreadPoolExecutor(1) as prober:
            probing = prober.submit(self.probes, [task for task, _, needs_probe in chunk if needs_probe])
            if units and self.config.wanted.compile_baseline and self.config.compile_jobs > 0:
                warm = self.precompiler.run(units, self.deadline, self.traces)
                self.log(f"precompiled {len(warm)} (task, track)s in {time.perf_counter() - started:.1f} s"
                         f" ({sum(w['ok'] for w in warm.values())} compiled)")
            probing.result()
        share = (time.perf_counter() - started) / max(1, sum(max(1, len(t)) for _, t, _ in chunk))
        return all(self.task(task, tracks, warm, share) for task, tracks, _ in chunk)

    def task(self, task: Task, tracks: list[str], warm: dict, share: float) -> bool:
        """Each track of the task (its probe, done before, knows the dtype the bound needs); False when
        the budget ran out."""
        precision = (task_entry(self.state, task).get("probe") or {}).get("precision")
        trace = self.traces.get(task.task_id)
        if tracks:
            task_entry(self.state, task)["trace"] = m.trace_fields(trace)
        for track in tracks:
            if self.left_s() < self.estimate_s():
                return False
            started = time.perf_counter()
            row = m.measure(task, track, self.configs[track], self.pool, self.held, self.peaks, trace, precision,
                            self.config.inductor_dir)
            row["precompile"] = warm.get((task.task_id, track))
            self.add(task, track, row)
            self.done += 1
            self.unit_s.append(time.perf_counter() - started + share)
            self.log(progress_line(task, track, row, self.unit_s[-1], self.done, self.total))
        if not tracks:
            self.unit_s.append(share)
        return True

    def probes(self, tasks: list[Task]) -> None:
        """The chunk's probes, one after another, beside the precompile (in the memory it leaves)."""
        device = self.config.evaluation.device
        for task in tasks:
            if not self.probe_ok:
                return
            with self.precompiler.gate.hold(m.MemoryGate.need(self.traces.get(task.task_id))):
                row = m.probe(task, device, now_utc())
            # A broken CUDA context (a sticky error) would fail every later probe: stop probing instead.
            self.probe_ok = "error" not in row or not m.probe_is_broken(device)
            if self.probe_ok:
                self.add(task, "probe", row)
            self.log(f"{task.task_id} probe: trivial@1e-4 {row.get('trivial@0.0001')} {row.get('error', '')}"[:300])


def progress_line(task: Task, track: str, row: dict[str, Any], seconds: float, done: int, total: int) -> str:
    def ms(stats: Any) -> str:
        return f"{stats['median_ms']:.4g} ms" if stats else "-"

    if "error" in row:
        what = f"ERROR {row['error'].splitlines()[0][:160]}"
    else:
        what = (f"eager {ms(row.get('eager'))}, compile {ms(row.get('compiled'))}"
                f"{' (' + row['compile_error'][:80] + ')' if row.get('compile_error') else ''},"
                f" SOL {ms({'median_ms': row['sol_bound_ms']}) if row.get('sol_bound_ms') else '-'},"
                f" FX cache entries added {row.get('fx_graph_entries_added')}; seconds: reference"
                f" {row.get('reference_s')}, compile {row.get('compile_s')}, settle {row.get('settle_s')},"
                f" eager {row.get('eager_s')}, compiled {row.get('compiled_s')}; job {row.get('worker_job')} of its"
                f" worker")
    return f"[{done}/{total}] {task.task_id} {track}: {what} ({seconds:.1f} s)"


def run_survey(config: SurveyConfig, tasks: list[Task], suite: Path, manifest: dict[str, Any],
               log: Callable[[str], None] = lambda line: None, measure: bool = True) -> dict[str, Any]:
    """Measure what the survey file lacks for `tasks` (nothing with measure=False: the table is only
    written again from what was read) and return the file's summary."""
    import torch  # lazy: the CLI imports this package at start

    torch.backends.cuda.matmul.allow_tf32 = False  # the probe's reference: the fp32 track
    torch.backends.cudnn.allow_tf32 = False
    state = open_state(config, suite)
    todo = plan(tasks, state, config.wanted)
    log(f"{len(tasks)} tasks, {sum(len(t) for _, t, _ in todo)} (task, track)s and"
        f" {sum(p for _, _, p in todo)} probes to do")
    runner = Runner(config, state, tasks, new_run(config, manifest), log)
    if todo and measure:
        runner.execute(todo)
    runner.run["finished_utc"] = now_utc()
    runner.save()
    left = plan(tasks, state, config.wanted)
    summary = summarize(state, len(left))
    log(f"done {runner.done} (task, track)s this run; {sum(len(t) for _, t, _ in left)} (task, track)s and"
        f" {sum(p for _, _, p in left)} probes left; probe verdict {summary['probe']['verdict']}")
    return summary
