"""Eager and torch.compile baselines, speed-of-light bounds and degenerate-task flags over KernelBench.

    python3 bench/baselines_kernelbench_h200.py --out DIR [--kernelbench PATH] [--levels 1,2]
        [--tracks fp32,tf32] [--budget-s 530] [--state bench/results/baselines-h200.json]
        [--compile-jobs N] [--chunk N] [--select SEL] [--work DIR] [--cache DIR] [--device cuda|cpu]
        [--timing-trials 100] [--no-compile] [--no-probe] [--retry-errors] [--report-only]

For every task of the chosen levels and each precision track (fp32: TF32 off; tf32: TF32 on):
- the eager and torch.compile baselines by cutegen's own protocol, through the evaluator's own path
  (`cutegen.evaluate.baselines.get_baselines`: one worker that measures task after task, as
  `cutegen baseline` does, `timing.time_forward`, eager timed twice, the result also cached under
  --cache), one task at a time, so nothing else uses the device while something is timed;
- the speed-of-light bound (`cutegen.evaluate.sol`: the device's peaks, measured once, and the
  task's meta-tensor trace), as the evaluator computes it for a candidate, and the fraction of it
  that eager and torch.compile reach;
- once per task, the trivial-solution probe of bench/probe_kernelbench_h200.py (fp32 reference in
  training mode, in this process, beside the precompile below, when nothing is timed): which trivial
  answers (zeros, a constant, an input) pass at 1e-4 and at 1e-2 on two input seeds, and which fail
  at most one element in a thousand (nearly trivial). A probe recorded by an earlier version (the
  reference in eval mode, or no failed fractions) is done again. The summary says whether every task
  EVALUATION.md lists as constant is flagged at 1e-4 and every one listed as nearly constant is
  flagged or nearly trivial, over the tasks probed so far, and lists the flagged tasks.

Resumable over several device calls: earlier results are read from --state (default
bench/results/baselines-h200.json, which travels with the working tree) and from DIR's own file (a
run that was killed), and a (task, track) whose entry has the task's current source sha256 is not
measured again (one that recorded an error is tried once more in a later run, as a worker can die
for reasons that are not the task's; with --retry-errors, on every run). DIR/baselines-h200.json (and
a short .md) is written atomically after every task and track, with the list of runs that added
entries, each with its machine manifest and what it added; the file holds one device and one torch
version. A task or track is not started when less of --budget-s is left than 1.5 times the median
seconds of the (task, track)s this run did (at least 10 s); what is left is printed, for the next call.

torch.compile's CPU work (inductor and triton compiles: 20-30 s for a small task) would dominate the
run, so it is paid ahead and in parallel. The tasks are taken in chunks of --chunk (task, track)s
(fewer when the budget left is short); for each chunk, --compile-jobs evaluator workers (processes
on the same device, kept for the whole run, each compiling task after task with one thread) build
each reference and its inputs exactly as the baseline worker does (its `reference` command with one
input set, then `baseline` with kind `compile`, the one call that compiles, then `release`). That
fills the FX graph, AOT
autograd and triton caches, which live in one folder under --work (TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR, set before any worker starts: workers keep those variables while their TMPDIR is
fresh). Then the chunk is measured serially and its compile is a cache hit (every worker compiles
in its own process, TORCHINDUCTOR_COMPILE_THREADS=1, so no compile worker starts beside them); each
entry records how many FX graph cache entries its measurement added
(`fx_graph_entries_added`: 0 means the precompile hit) and where its seconds went. Triton's
autotuning results found during the parallel precompile (the device was shared) are deleted before
the chunk is measured, so the measured compile tunes on an idle device, as it would alone. The
precompile jobs share the host's memory by an estimate from each task's trace (KernelBench's largest
inputs take 6.4 GB).

--device cpu runs the same steps on the CPU (no speed-of-light bound there: the peaks are a GPU's);
it is for checking the plumbing and the cache, not a measurement. KernelBench is found at
--kernelbench, else $CUTEGEN_KERNELBENCH, else .kernelbench/ in the repo, else ../shared/kernelbench.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

# bench/, this script's folder, is first on sys.path
from probe_kernelbench_h200 import MODE, MUST_FLAG, find_kernelbench, judge, probe_task, task_order  # noqa: E402

RESULT_NAME = "baselines-h200.json"
DEFAULT_STATE = REPO / "bench" / "results" / RESULT_NAME
SCHEMA = 1
MIN_TASK_S = 10.0  # the per-(task, track) estimate before this run has measured any, and its floor
ESTIMATE_FACTOR = 1.5


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


# ------------------------------------------------------------------------------------- the state


def load_state(path: Path | None) -> dict[str, Any]:
    """A results file, or an empty state when there is none (a half-written file cannot exist: every
    write replaces the file atomically)."""
    if path is None or not Path(path).is_file():
        return {"schema": SCHEMA, "tasks": {}, "runs": []}
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        sys.exit(f"{path} has schema {data.get('schema')!r}, this script writes {SCHEMA}: move the file away"
                 " or pass --state none to start afresh.")
    return data


def newest(*items: dict[str, Any] | None) -> dict[str, Any] | None:
    found = [i for i in items if i]
    return max(found, key=lambda i: i.get("measured_utc", "")) if found else None


def merge_states(*states: dict[str, Any]) -> dict[str, Any]:
    """One state from several (the --state file and a killed run's output): per task and track the
    most recently measured entry wins; a task whose source changed keeps only its newest entry."""
    merged: dict[str, Any] = {"schema": SCHEMA, "tasks": {}, "runs": []}
    for state in states:
        for key in ("device", "peaks", "kernelbench"):
            merged[key] = state.get(key) or merged.get(key)
        known = {r["id"] for r in merged["runs"]}
        merged["runs"] += [r for r in state.get("runs", []) if r["id"] not in known]
        for task_id, entry in state.get("tasks", {}).items():
            merged["tasks"][task_id] = merge_task(merged["tasks"].get(task_id), entry)
    merged["runs"].sort(key=lambda r: r.get("started_utc", ""))
    return {k: v for k, v in merged.items() if v is not None}


def merge_task(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    if old is None:
        return new
    if old["source_sha256"] != new["source_sha256"]:
        stamps = [max([e.get("measured_utc", "") for e in [t.get("probe") or {}, *t.get("tracks", {}).values()]])
                  for t in (old, new)]
        return new if stamps[1] >= stamps[0] else old
    names = sorted({*old["tracks"], *new["tracks"]})  # sorted: a file rewritten keeps its order
    tracks = {k: newest(old["tracks"].get(k), new["tracks"].get(k)) for k in names}
    return {**old, **new, "tracks": tracks, "probe": newest(old.get("probe"), new.get("probe"))}


ERROR_ATTEMPTS = 2  # a worker can die for reasons that are not the task's: an error is measured once more


def entry_done(entry: dict[str, Any] | None, want_compile: bool, retry_errors: bool) -> bool:
    """A track's (or the probe's) entry serves when it holds what this run asks for (as `_satisfies` in
    baselines); one that recorded an error serves after ERROR_ATTEMPTS tries, or never with --retry-errors."""
    if entry is None:
        return False
    if "error" in entry:
        return not retry_errors and entry.get("attempts", 1) >= ERROR_ATTEMPTS
    return not (want_compile and entry.get("compiled") is None and entry.get("compile_error") is None)


def probe_current(entry: dict[str, Any]) -> bool:
    """A recorded probe (or its error) of the reference in the evaluator's mode, with each trivial
    answer's failed fraction; the first probes ran it in eval mode, the next ones kept no fractions."""
    return "error" in entry or (entry.get("mode") == MODE and "mismatch@0.01" in entry)


def probe_done(entry: dict[str, Any] | None, retry_errors: bool) -> bool:
    """A probe serves as a track's entry does, when it is current (the others are probed again)."""
    return entry_done(entry, False, retry_errors) and probe_current(entry)


def plan(tasks: list[Any], state: dict[str, Any], args: argparse.Namespace) -> list[tuple[Any, list[str], bool]]:
    """(task, tracks to measure, probe needed) for each task with something left to do."""
    todo = []
    for task in tasks:
        entry = state["tasks"].get(task.task_id)
        if entry is not None and entry["source_sha256"] != task.source_sha256:
            entry = None  # the task changed since it was measured: all of it again
        tracks = [t for t in args.tracks if not entry_done((entry or {}).get("tracks", {}).get(t),
                                                            args.compile, args.retry_errors)]
        probe = args.probe and not probe_done((entry or {}).get("probe"), args.retry_errors)
        if tracks or probe:
            todo.append((task, tracks, probe))
    return todo


def task_entry(state: dict[str, Any], task: Any) -> dict[str, Any]:
    """The task's entry in the state, made afresh when the task's source changed."""
    entry = state["tasks"].get(task.task_id)
    if entry is None or entry["source_sha256"] != task.source_sha256:
        entry = {"name": task.name, "level": task.level, "problem_id": task.problem_id,
                 "source_sha256": task.source_sha256, "tracks": {}, "probe": None}
        state["tasks"][task.task_id] = entry
    return entry


def check_device(state: dict[str, Any], info: dict[str, Any], state_path: Path | None) -> None:
    """One results file holds one device and one torch version: mixing them would make a table of
    numbers that cannot be compared."""
    here = {"device_name": info["device_name"], "torch_version": info["torch_version"]}
    there = state.get("device")
    if there and state.get("tasks") and there != here:
        sys.exit(f"The results read (from {state_path} and --out) were measured on {there['device_name']} with torch"
                 f" {there['torch_version']}; this machine is {here['device_name']} with torch {here['torch_version']}."
                 " Pass --state none and another --out to start a separate file.")
    state["device"] = here


# ------------------------------------------------------------------------------------- writing


def write_results(out: Path, state: dict[str, Any], run: dict[str, Any], tasks: list[Any],
                  args: argparse.Namespace) -> None:
    """DIR/baselines-h200.json and .md, each replaced atomically (tmp file + os.replace): a run killed at
    any moment leaves the last complete file."""
    snapshot = dict(state)
    if run["added"]:  # a run that added nothing is not listed
        snapshot["runs"] = [r for r in state["runs"] if r["id"] != run["id"]] + [run]
    snapshot["manifest"] = (snapshot["runs"][-1] if snapshot["runs"] else run)["manifest"]
    snapshot["summary"] = summarize(snapshot, len(plan(tasks, snapshot, args)))
    out.mkdir(parents=True, exist_ok=True)
    for name, text in ((RESULT_NAME, json.dumps(snapshot, indent=1, default=str)),
                       (RESULT_NAME.replace(".json", ".md"), markdown(snapshot))):
        tmp = out / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)


def summarize(state: dict[str, Any], tasks_left: int) -> dict[str, Any]:
    tasks = state.get("tasks", {})
    per_group: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    peaks = (state.get("peaks") or {}).get("peaks")
    for task_id, entry in sorted(tasks.items(), key=lambda kv: task_order(kv[0])):
        for track, row in entry.get("tracks", {}).items():
            row = {**row, "hardware_fraction": hardware_fraction(entry, row, track, peaks)}
            for group in (track, f"level{entry.get('level')} {track}"):
                per_group.setdefault(group, []).append((task_id, row))
    groups = {name: group_stats(rows) for name, rows in per_group.items()}
    # The flags of record come from probes in the evaluator's mode; the others wait to be probed again.
    probes = {t: e["probe"] for t, e in tasks.items() if e.get("probe")}
    rows = [{"task_id": t, **p} for t, p in probes.items() if probe_current(p)]
    probe = judge(rows)
    probe["stale"] = sorted((t for t, p in probes.items() if not probe_current(p)), key=task_order)
    probe["flagged_1e-4"] = sorted((r["task_id"] for r in rows if r.get("trivial@0.0001")), key=task_order)
    probe["flagged_1e-2"] = sorted((r["task_id"] for r in rows if r.get("trivial@0.01")), key=task_order)
    probe["near_trivial_1e-2"] = sorted((r["task_id"] for r in rows if r.get("near_trivial@0.01")
                                         and not r.get("trivial@0.01")), key=task_order)
    probe["must_flag_not_probed_yet"] = sorted(MUST_FLAG - {r["task_id"] for r in rows if "error" not in r})
    probe["every_must_flag_probed_is_flagged"] = not probe["must_flag_missed"]
    return {"tasks": len(tasks), "tasks_left": tasks_left, "groups": groups, "probe": probe}


def hardware_fraction(entry: dict[str, Any], row: dict[str, Any], track: str, peaks: dict | None) -> float | None:
    """The fraction of the hardware's bound (`sol.physical_peaks`, the bound the evaluator rejects
    past) that the faster of eager and torch.compile reaches, from the task's trace and the peaks."""
    import types

    from cutegen.config import HALF_DTYPES
    from cutegen.evaluate.sol import physical_peaks, sol_bound_ms
    from cutegen.journal import from_json
    from cutegen.records import Peaks

    trace, times = entry.get("trace") or {}, [t["median_ms"] for t in (row.get("eager"), row.get("compiled")) if t]
    if not peaks or not times or trace.get("flops") is None or trace.get("min_bytes") is None:
        return None
    half = (entry.get("probe") or {}).get("precision") in HALF_DTYPES
    bound = sol_bound_ms(types.SimpleNamespace(flops=trace["flops"], min_bytes=trace["min_bytes"]),
                         physical_peaks(from_json(Peaks, peaks)), track, half)
    return bound / min(times) if bound else None


def group_stats(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Counts and medians of one track (or level and track). `beyond_bound` lists the tasks whose eager
    or compiled time is below the speed-of-light bound of the measured peaks, which a very good
    kernel can be (the peaks are rates measured here, not limits); `beyond_hardware_bound` those below
    the hardware's bound, which no correct implementation can be (a wrong FLOP or byte count: check it)."""
    measured = [(t, r) for t, r in rows if "error" not in r]
    speedups = [r["compile_speedup"] for _, r in measured if r.get("compile_speedup")]

    def median(key: str) -> float | None:
        values = [r[key] for _, r in measured if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {"measured": len(measured), "errors": len(rows) - len(measured),
            "compiled": sum(r.get("compiled") is not None for _, r in measured),
            "compile_errors": sum(r.get("compile_error") is not None for _, r in measured),
            "median_sol_fraction_eager": median("sol_fraction_eager"),
            "median_sol_fraction_compiled": median("sol_fraction_compiled"),
            "geomean_compile_speedup": statistics.geometric_mean(speedups) if speedups else None,
            "median_noise_pct": median("noise_pct"),
            "beyond_bound": [t for t, r in measured
                             if max(r.get("sol_fraction_eager") or 0, r.get("sol_fraction_compiled") or 0) > 1.0],
            "max_hardware_fraction": max((r["hardware_fraction"] for _, r in measured if r.get("hardware_fraction")),
                                         default=None),
            "beyond_hardware_bound": [t for t, r in measured if (r.get("hardware_fraction") or 0) > 1.0]}


def markdown(state: dict[str, Any]) -> str:
    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.4g}"

    summary, m = state["summary"], state.get("manifest") or {}
    probe = summary["probe"]
    tracks = {name: g for name, g in summary["groups"].items() if " " not in name}
    beyond = [f"{t} ({name})" for name, g in tracks.items() for t in g["beyond_bound"]]
    beyond_hardware = [f"{t} ({name})" for name, g in tracks.items() for t in g["beyond_hardware_bound"]]
    closest = max((g["max_hardware_fraction"] or 0 for g in tracks.values()), default=0)
    lines = ["# KernelBench baselines: eager and torch.compile, speed of light, degenerate tasks", "",
             f"{m.get('gpu_name') or 'no GPU'}, driver {m.get('driver_version')}, CUDA {m.get('cuda_runtime')},"
             f" torch {m.get('torch_version')}; {len(state.get('runs', []))} runs; {summary['tasks']} tasks,"
             f" {summary['tasks_left']} with something left to measure.", "",
             "| group | measured | errors | compiled | compile errors | eager SOL (median) | compile SOL (median)"
             " | compile speedup (geomean) | eager noise % (median) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, g in sorted(summary["groups"].items(), key=lambda kv: (" " in kv[0], kv[0])):
        lines.append(f"| {name} | {g['measured']} | {g['errors']} | {g['compiled']} | {g['compile_errors']} |"
                     f" {ms(g['median_sol_fraction_eager'])} | {ms(g['median_sol_fraction_compiled'])} |"
                     f" {ms(g['geomean_compile_speedup'])} | {ms(g['median_noise_pct'])} |")
    stale = probe.get("stale", [])
    lines += ["", f"Trivial-solution probe: {probe['tasks_probed']} tasks probed, verdict **{probe['verdict']}**"
              f" (listed as constant and missed at 1e-4: {', '.join(probe['must_flag_missed']) or '-'};"
              f" not probed yet: {', '.join(probe['must_flag_not_probed_yet']) or '-'})."
              + (f" {len(stale)} tasks were probed by an earlier probe (the reference in eval mode, which the"
                 " evaluator does not use, or no failed fractions): they are left out here and probed again."
                 if stale else ""), "",
              f"- flagged at 1e-4: {', '.join(probe['flagged_1e-4']) or '-'}",
              f"- flagged at 1e-2: {', '.join(probe['flagged_1e-2']) or '-'}",
              "- nearly trivial at 1e-2 (a trivial answer fails at most one element in a thousand), not flagged:"
              f" {', '.join(probe['near_trivial_1e-2']) or '-'}",
              "- listed as nearly constant in EVALUATION.md: found (flagged or nearly trivial at 1e-4 or 1e-2)"
              f" {', '.join(probe['nearly_constant_found']) or '-'}; missed"
              f" {', '.join(probe['nearly_constant_missed']) or '-'}",
              f"- flagged but not listed in EVALUATION.md: {', '.join(probe['flagged_not_listed']) or '-'}",
              "- eager or torch.compile below the speed-of-light bound of the measured peaks:"
              f" {', '.join(beyond) or '-'}",
              f"- eager or torch.compile below the hardware's bound (measured or datasheet peaks, whichever is higher;"
              f" the evaluator rejects past it): {', '.join(beyond_hardware) or '-'} (the closest reaches"
              f" {closest:.3f} of it)", "",
              "| task | fp32 eager ms | fp32 compile ms | tf32 eager ms | tf32 compile ms | SOL fp32 ms | SOL tf32 ms"
              " | trivial @1e-4 | note |", "|---|---|---|---|---|---|---|---|---|"]
    for task_id in sorted(state.get("tasks", {}), key=task_order):
        lines.append(task_line(task_id, state["tasks"][task_id], ms))
    return "\n".join(lines) + "\n"


def task_line(task_id: str, entry: dict[str, Any], ms: Any) -> str:
    tracks, probe = entry.get("tracks", {}), entry.get("probe") or {}
    cells, notes = [], []
    for track in ("fp32", "tf32"):
        row = tracks.get(track) or {}
        cells += [ms((row.get("eager") or {}).get("median_ms")), ms((row.get("compiled") or {}).get("median_ms"))]
        for key in ("error", "compile_error"):
            if row.get(key):
                notes.append(f"{track} {key.replace('_', ' ')}: {row[key].splitlines()[0][:80]}")
    cells += [ms((tracks.get(t) or {}).get("sol_bound_ms")) for t in ("fp32", "tf32")]
    flags = ", ".join(probe.get("trivial@0.0001", [])) or ("probe error" if "error" in probe else "-")
    cells.append(flags if not probe or probe_current(probe) else f"{flags} (earlier probe)")
    note = "; ".join(notes).replace("|", "/")
    return f"| {task_id} {entry.get('name', '')} | " + " | ".join(cells) + f" | {note or '-'} |"


# ------------------------------------------------------------------------------------- measuring


def configs(args: argparse.Namespace) -> dict[str, Any]:
    from cutegen.cli import env as cli_env
    from cutegen.config import EvalConfig

    return {track: EvalConfig(track=track, device=args.device, backend="cute" if args.device == "cuda" else "torch",
                              timing_trials=args.timing_trials, compile_baseline=args.compile,
                              cache_dir=args.cache / "eval", runtime=cli_env.runtime_config(), gpus=(args.gpu,))
            for track in args.tracks}


def precompile_job(task: Any, config: Any) -> dict[str, Any]:
    """The baseline worker's `reference` payload (`baselines._measure`), cut down to one trial, so one
    input set (the `compile` command then makes the one call that compiles): the same model, inputs,
    track flags and grad mode, so the graph inductor compiles, and its cache key, are the ones the
    measurement will ask for."""
    from cutegen.evaluate.jobs import reference_job

    return reference_job(task, config, trials=1, adversarial=0, weight_seeds=1, probe=False, exact=False,
                         reusable=True)


def precompile_one(held: Any, task: Any, config: Any, deadline: float) -> dict[str, Any]:
    """Compile one (task, track) in `held`'s worker (a `baselines.BaselineWorker`), which it releases."""
    from cutegen.errors import ToolchainError
    from cutegen.evaluate.worker import WorkerDied

    started = time.perf_counter()
    left_s = max(30.0, deadline - time.monotonic())
    try:
        worker = held.take()
        reply = worker.call("reference", precompile_job(task, config),
                            timeout_s=min(config.reference_timeout_s, left_s))
        if reply.get("ok"):
            reply = worker.call("baseline", {"kind": "compile"}, timeout_s=min(config.run_timeout_s, left_s))
    except (WorkerDied, ToolchainError) as err:  # only a warm-up: the measurement will say what failed
        reply = {"ok": False, "error": {"message": str(err)}}
    finally:
        held.release(min(config.run_timeout_s, left_s))
    error = (reply.get("data") or {}).get("compile_error") if reply.get("ok") else \
        f"{(reply.get('error') or {}).get('type', '')}: {(reply.get('error') or {}).get('message', '')}"
    return {"s": round(time.perf_counter() - started, 2), "ok": error is None,
            "error": error[:400] if error else None}


class MemoryGate:
    """Admits precompile jobs while their estimated host memory fits in a budget. KernelBench's level1
    activations take 6.4 GB per input, and a worker holds its inputs twice and the output once: seven
    of them at once would exhaust the host. A job larger than the whole budget runs alone."""

    WORKER_BYTES = 2 << 30  # torch, a CUDA context, inductor's compile processes

    def __init__(self, budget_bytes: int) -> None:
        self.budget = self.free = budget_bytes
        self.cond = threading.Condition()

    @classmethod
    def need(cls, trace: Any) -> int | None:
        """Estimated peak host bytes of one precompile worker; None when the trace does not say."""
        if isinstance(trace, str) or trace is None or trace.min_bytes is None:
            return None
        return 2 * trace.input_bytes + trace.output_bytes + trace.param_bytes + cls.WORKER_BYTES

    @contextlib.contextmanager
    def hold(self, need: int | None) -> Iterator[None]:
        need = self.budget if need is None else min(need, self.budget)
        with self.cond:
            self.cond.wait_for(lambda: self.free >= need)
            self.free -= need
        try:
            yield
        finally:
            with self.cond:
                self.free += need
                self.cond.notify_all()


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else a large number."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 40


class Precompiler:
    """--compile-jobs lanes, each a worker kept from chunk to chunk (`baselines.BaselineWorker`) that
    takes the next (task, track) of the chunk when it has compiled one. Every worker compiles with one
    thread (TORCHINDUCTOR_COMPILE_THREADS=1, set in main): with a lane per CPU, inductor's own compile
    worker processes would only add their start-up to every compile."""

    def __init__(self, args: argparse.Namespace, configs_by_track: dict[str, Any]) -> None:
        from cutegen.evaluate.baselines import BaselineWorker
        from cutegen.evaluate.worker import WorkerPool

        self.configs = configs_by_track
        self.jobs = max(1, args.compile_jobs)
        slots = {"gpus": (args.gpu,) * self.jobs} if args.device == "cuda" else {"cpu_slots": self.jobs}
        self.gate = MemoryGate(int(0.6 * available_memory_bytes()))
        self.pool = WorkerPool(args.device, warm_spares=False, warm_profiler=False, warm_compile=True, **slots)
        self.lanes = [BaselineWorker(self.pool) for _ in range(self.jobs)]

    def run(self, units: list[tuple[Any, str]], deadline: float,
            traces: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        """Compile every (task, track) of a chunk once."""
        from concurrent.futures import ThreadPoolExecutor

        queue, lock = list(units), threading.Lock()
        results: dict[tuple[str, str], dict[str, Any]] = {}

        def lane(held: Any) -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    task, track = queue.pop(0)
                with self.gate.hold(MemoryGate.need(traces.get(task.task_id))):
                    results[(task.task_id, track)] = precompile_one(held, task, self.configs[track], deadline)

        lanes = self.lanes[:len(units)]
        with ThreadPoolExecutor(len(lanes)) as executor:
            for done in [executor.submit(lane, held) for held in lanes]:
                done.result()
        # Autotuning choices made while the device was shared would be reused by the measured compile.
        for path in Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.best_config"):
            path.unlink(missing_ok=True)
        return results

    def __enter__(self) -> "Precompiler":
        return self

    def __exit__(self, *exc: Any) -> None:
        for held in self.lanes:
            held.drop()
        self.pool.close()


def fx_graph_entries() -> int:
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "fxgraph"
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def measure(task: Any, track: str, config: Any, pool: Any, held: Any, peaks: Any, trace: Any,
            precision: str | None) -> dict[str, Any]:
    """One (task, track): the baselines through the evaluator's path, then the speed-of-light fields."""
    from cutegen.errors import TaskError
    from cutegen.evaluate.baselines import get_baselines
    from cutegen.records import to_json

    before, started = fx_graph_entries(), time.perf_counter()
    try:
        baselines = get_baselines(task, config, pool, held)
    except TaskError as err:  # the reference fails: a fact about the task, recorded; the run goes on
        return {"error": err.problem[:2000], "seconds": round(time.perf_counter() - started, 2)}
    row = {k: v for k, v in to_json(baselines).items() if k not in ("task_id", "task_sha256", "track")}
    row["seconds"] = round(time.perf_counter() - started, 2)
    row["fx_graph_entries_added"] = fx_graph_entries() - before if config.compile_baseline else None
    eager, compiled = baselines.eager, baselines.compiled
    row["compile_speedup"] = eager.median_ms / compiled.median_ms if eager and compiled else None
    row.update(sol_fields(trace, peaks, track, precision, eager, compiled))
    return row


def sol_fields(trace: Any, peaks: Any, track: str, precision: str | None, eager: Any, compiled: Any) -> dict:
    """The bound as pipeline._speed computes it for a candidate: the half-precision peak when the
    task's lowest-precision tensor is bf16/fp16 (known from the probe's reference run), else the
    track's fp32 rule."""
    from cutegen.config import HALF_DTYPES
    from cutegen.evaluate.sol import sol_bound_ms

    if peaks is None:
        return {"sol_bound_ms": None, "sol_error": "no peaks: the speed of light is measured on a CUDA device only"}
    if isinstance(trace, str) or trace.error:
        return {"sol_bound_ms": None, "sol_error": f"trace failed: {trace if isinstance(trace, str) else trace.error}"}
    bound = sol_bound_ms(trace, peaks, track, precision in HALF_DTYPES)
    return {"sol_bound_ms": bound, "sol_precision": precision or "float32 (assumed: no probe)",
            "sol_fraction_eager": bound / eager.median_ms if bound and eager and eager.median_ms > 0 else None,
            "sol_fraction_compiled": bound / compiled.median_ms if bound and compiled and compiled.median_ms > 0
            else None}


def trace_of(task: Any) -> Any:
    """The task's meta-tensor trace, or the reason it could not be made (a task that cannot load)."""
    from cutegen.errors import TaskError
    from cutegen.trace import trace_task

    try:
        return trace_task(task)
    except TaskError as err:
        return err.problem[:300]


def trace_fields(trace: Any) -> dict[str, Any]:
    if isinstance(trace, str):
        return {"error": trace}
    return {"flops": trace.flops, "min_bytes": trace.min_bytes, "workload_class": trace.workload_class,
            "anchor_op": trace.anchor_op, "error": trace.error}


def probe(task: Any, device: str) -> dict[str, Any]:
    """probe_kernelbench_h200.probe_task (fp32 flags are set in main) for one task; a failure is recorded."""
    import traceback

    try:
        row = probe_task(task, device)
    except Exception as err:  # noqa: BLE001 - one broken task must not end the run
        row = {"error": f"{type(err).__name__}: {err}"[:400], "trace": traceback.format_exc()[-800:]}
    if device == "cuda":  # the measuring worker, not this process, needs the device's memory next
        import torch

        torch.cuda.empty_cache()
    row.pop("task_id", None)
    row.pop("name", None)
    return {**row, "measured_utc": now_utc()}


def probe_is_broken(device: str) -> bool:
    """After a probe error on the GPU: True when this process's CUDA context is broken (a sticky
    error), so that no later task's probe records that error as its own."""
    if device != "cuda":
        return False
    from cutegen.evaluate.protocol import cuda_healthy

    return not cuda_healthy()


# --------------------------------------------------------------------------------------- the run


class Runner:
    """The measuring loop over chunks: precompile a chunk in parallel, then measure it serially."""

    def __init__(self, args: argparse.Namespace, state: dict[str, Any], tasks: list[Any], run: dict[str, Any]):
        self.args, self.state, self.tasks, self.run = args, state, tasks, run
        self.configs = configs(args)
        self.deadline = time.monotonic() + args.budget_s
        self.unit_s: list[float] = []  # seconds per (task, track) of this run, the precompile's share included
        self.pool: Any = None
        self.held: Any = None  # the measuring worker, kept from task to task (baselines.BaselineWorker)
        self.precompiler: Any = None
        self.peaks: Any = None
        self.probe_ok = args.probe
        self.traces: dict[str, Any] = {}  # task id -> TaskTrace, or why it failed
        self.done, self.total = 0, 0

    def estimate_s(self) -> float:
        return max(MIN_TASK_S, ESTIMATE_FACTOR * statistics.median(self.unit_s)) if self.unit_s else MIN_TASK_S

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        write_results(self.args.out, self.state, self.run, self.tasks, self.args)

    def add(self, task: Any, key: str, value: dict[str, Any]) -> None:
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

    def execute(self, todo: list[tuple[Any, list[str], bool]]) -> None:
        from cutegen.evaluate.baselines import BaselineWorker
        from cutegen.evaluate.sol import get_peaks
        from cutegen.evaluate.worker import WorkerPool
        from cutegen.records import to_json

        self.total = sum(len(tracks) for _, tracks, _ in todo)
        first = self.configs[self.args.tracks[0]]
        # No kernel audit here. One worker measures task after task; its spare, which takes over when it
        # dies, imports torch.compile's machinery while it waits.
        with WorkerPool.for_config(first, warm_profiler=False, warm_compile=self.args.compile) as self.pool, \
                BaselineWorker(self.pool) as self.held, Precompiler(self.args, self.configs) as self.precompiler:
            info = self.pool.info()
            check_device(self.state, info, self.args.state)
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

    def load_peaks(self, config: Any, info: dict[str, Any]) -> Any:
        """The peaks of an earlier run on the same device and torch: one set of bounds for the table."""
        from cutegen.evaluate.cache import save_json
        from cutegen.evaluate.sol import load_peaks, peaks_path

        saved = self.state.get("peaks") or {}
        if config.device != "cuda" or saved.get("device_name") != info["device_name"] \
                or saved.get("torch_version") != info["torch_version"]:
            return None
        path = peaks_path(config.cache_dir, info["device_name"], info["torch_version"])
        save_json(path, saved["peaks"])
        return load_peaks(path)

    def next_chunk(self, pending: list[tuple[Any, list[str], bool]]) -> list[tuple[Any, list[str], bool]]:
        """The next tasks, about --chunk (task, track)s, a task's tracks together, as many as the budget
        left can measure at the current estimate (only those are precompiled)."""
        fits = min(self.args.chunk, int(self.left_s() // self.estimate_s()))
        chunk, units = [], 0
        for item in pending:
            units += max(1, len(item[1]))
            if units > fits:
                break
            chunk.append(item)
        return chunk

    def chunk(self, chunk: list[tuple[Any, list[str], bool]]) -> bool:
        """Precompile one chunk and probe its tasks meanwhile (nothing is timed then), then measure it
        serially; False when the budget ran out."""
        from concurrent.futures import ThreadPoolExecutor

        started = time.perf_counter()
        for task, tracks, _ in chunk:
            if tracks and task.task_id not in self.traces:
                self.traces[task.task_id] = trace_of(task)
        units_to_compile = [(t, k) for t, tracks, _ in chunk for k in tracks]
        warm: dict[tuple[str, str], dict[str, Any]] = {}
        with ThreadPoolExecutor(1) as prober:
            probing = prober.submit(self.probes, [task for task, _, needs_probe in chunk if needs_probe])
            if units_to_compile and self.args.compile and self.args.compile_jobs > 0:
                warm = self.precompiler.run(units_to_compile, self.deadline, self.traces)
                print(f"precompiled {len(warm)} (task, track)s in {time.perf_counter() - started:.1f} s"
                      f" ({sum(w['ok'] for w in warm.values())} compiled)", flush=True)
            probing.result()
        share = (time.perf_counter() - started) / max(1, sum(max(1, len(t)) for _, t, _ in chunk))
        for task, tracks, _ in chunk:
            if not self.task(task, tracks, warm, share):
                return False
        return True

    def task(self, task: Any, tracks: list[str], warm: dict, share: float) -> bool:
        """Each track of the task (its probe, done before, knows the dtype the bound needs); False when
        the budget ran out."""
        precision = (task_entry(self.state, task).get("probe") or {}).get("precision")
        trace = self.traces.get(task.task_id)
        if tracks:
            task_entry(self.state, task)["trace"] = trace_fields(trace)
        for track in tracks:
            if self.left_s() < self.estimate_s():
                return False
            started = time.perf_counter()
            row = measure(task, track, self.configs[track], self.pool, self.held, self.peaks, trace, precision)
            row["precompile"] = warm.get((task.task_id, track))
            self.add(task, track, row)
            self.done += 1
            self.unit_s.append(time.perf_counter() - started + share)
            print(progress_line(task, track, row, self.unit_s[-1], self.done, self.total), flush=True)
        if not tracks:
            self.unit_s.append(share)
        return True

    def probes(self, tasks: list[Any]) -> None:
        """The chunk's probes, one after another, beside the precompile (in the memory it leaves)."""
        for task in tasks:
            if not self.probe_ok:
                return
            with self.precompiler.gate.hold(MemoryGate.need(self.traces.get(task.task_id))):
                row = probe(task, self.args.device)
            # A broken CUDA context (a sticky error) would fail every later probe: stop probing instead.
            self.probe_ok = "error" not in row or not probe_is_broken(self.args.device)
            if self.probe_ok:
                self.add(task, "probe", row)
            print(f"{task.task_id} probe: trivial@1e-4 {row.get('trivial@0.0001')} {row.get('error', '')}"[:300],
                  flush=True)


def progress_line(task: Any, track: str, row: dict[str, Any], seconds: float, done: int, total: int) -> str:
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


# ------------------------------------------------------------------------------------------ main


def load_suite(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    from cutegen.errors import ConfigError
    from cutegen.tasks import load_tasks, select_tasks

    root = find_kernelbench(args.kernelbench)
    tasks = []
    for level in args.levels:
        if not (root / f"level{level}").is_dir():
            sys.exit(f"{root} has no level{level}/ folder: pass --levels with the levels it holds.")
        tasks += load_tasks(root, select=f"level{level}")
    if args.select:
        try:
            tasks = select_tasks(tasks, args.select)  # the selector of every cutegen command
        except ConfigError as err:
            sys.exit(str(err))
    return tasks, kernelbench_info(root)


def kernelbench_info(root: Path) -> dict[str, Any]:
    """The task set's name and commit (from SOURCE.md when the copy has one): no local path."""
    source = root / "SOURCE.md"
    match = re.search(r"commit\s+([0-9a-f]{7,40})", source.read_text()) if source.is_file() else None
    return {"folder": root.name, "commit": match.group(1) if match else None}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help=f"folder for {RESULT_NAME} and its .md")
    parser.add_argument("--state", default=str(DEFAULT_STATE),
                        help="earlier results to resume from ('none' to start afresh)")
    parser.add_argument("--kernelbench")
    parser.add_argument("--levels", default="1,2")
    parser.add_argument("--tracks", default="fp32,tf32")
    parser.add_argument("--select", help="tasks, as cutegen's --select: level1/19, level2:1-20, '*relu*' (comma list)")
    parser.add_argument("--budget-s", type=float, default=530.0)
    parser.add_argument("--compile-jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                        help="parallel precompile workers (default: the CPUs less two, so one compile thread"
                             " each; 0: no precompile)")
    parser.add_argument("--chunk", type=int, default=None, help="(task, track)s per precompile chunk"
                        " (default: twice --compile-jobs)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "cutegen-baselines-h200",
                        help="holds the inductor and triton caches")
    parser.add_argument("--cache", type=Path, help="cutegen's evaluation cache root (default: WORK/cache)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--timing-trials", type=int, default=100)
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="eager baselines only")
    parser.add_argument("--no-probe", dest="probe", action="store_false")
    parser.add_argument("--retry-errors", action="store_true", help="measure again what recorded an error")
    parser.add_argument("--report-only", action="store_true",
                        help="measure nothing: write the summary and table of the results read (no GPU needed)")
    args = parser.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    args.tracks = [t.strip() for t in args.tracks.split(",") if t.strip()]
    if not set(args.tracks) <= {"fp32", "tf32"} or not args.tracks:
        parser.error(f"--tracks {','.join(args.tracks)!r}: give fp32, tf32 or both")
    args.state = None if args.state.lower() == "none" else Path(args.state)
    args.cache = args.cache or args.work / "cache"
    args.chunk = args.chunk or max(2, 2 * args.compile_jobs)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    # Before any worker exists: every worker (precompile and measurement) compiles into these folders.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(args.work / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(args.work / "triton"))
    # Every worker compiles in its own process: the measuring worker's graphs are cache hits after the
    # precompile, and each precompile lane has a CPU of its own (see Precompiler).
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if args.device == "cpu":
        # Inductor keeps the C++ precompiled headers of CPU kernels in the temp folder, which is fresh
        # in every worker: it rebuilt them (~7 s) at each compile even on a cache hit. It only makes
        # C++ compiles faster, and precompile and measurement share the setting.
        os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # the probe's reference: the fp32 track
    torch.backends.cudnn.allow_tf32 = False
    tasks, suite = load_suite(args)
    state = merge_states(load_state(args.state), load_state(args.out / RESULT_NAME))
    state["kernelbench"] = suite
    todo = plan(tasks, state, args)
    print(f"{len(tasks)} tasks, {sum(len(t) for _, t, _ in todo)} (task, track)s and"
          f" {sum(p for _, _, p in todo)} probes to do", flush=True)
    runner = Runner(args, state, tasks, new_run(args))
    if todo and not args.report_only:
        runner.execute(todo)
    runner.run["finished_utc"] = now_utc()
    runner.save()
    left = plan(tasks, state, args)
    print(f"done {runner.done} (task, track)s this run; {sum(len(t) for _, t, _ in left)} (task, track)s and"
          f" {sum(p for _, _, p in left)} probes left; probe verdict"
          f" {summarize(state, len(left))['probe']['verdict']}", flush=True)
    return 0


def new_run(args: argparse.Namespace) -> dict[str, Any]:
    """This run's record: the machine manifest, the settings, and (filled in as it goes) what it added."""
    from cutegen.cli import env as cli_env
    from cutegen.manifest import machine_manifest

    started = now_utc()
    return {"id": f"{started}-{os.getpid()}", "started_utc": started,
            "manifest": machine_manifest(cli_env.runtime_config()), "device": args.device, "added": [],
            "settings": {"levels": args.levels, "tracks": args.tracks, "select": args.select,
                         "budget_s": args.budget_s, "compile": args.compile, "compile_jobs": args.compile_jobs,
                         "chunk": args.chunk, "timing_trials": args.timing_trials}}


if __name__ == "__main__":
    sys.exit(main())
