"""The survey's file: one JSON object holding every (task, track)'s baselines and bounds, every task's
probe, and the runs that added them, each with its machine manifest.

Resumable over several calls: a (task, track) whose entry has the task's current source sha256 is
not measured again (one that recorded an error is tried once more, as a worker can die for reasons
that are not the task's). The file holds one device and one torch version, and is replaced
atomically after every entry, so a run killed at any moment leaves the last complete file.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from cutegen.config import HALF_DTYPES
from cutegen.errors import ConfigError
from cutegen.evaluate.sol import work_bound_ms
from cutegen.records import Peaks, Task, TaskTrace
from cutegen.survey.probe import MODE, MUST_FLAG, judge, task_order

SCHEMA = 1
ERROR_ATTEMPTS = 2  # a worker can die for reasons that are not the task's: an error is measured once more


@dataclass(frozen=True)
class Wanted:
    """What a run asks of every task: which tracks, torch.compile or not, the probe or not, and whether
    entries that recorded an error are measured again on every run."""

    tracks: tuple[str, ...] = ("fp32", "tf32")
    compile_baseline: bool = True
    probe: bool = True
    retry_errors: bool = False


def empty_state() -> dict[str, Any]:
    return {"schema": SCHEMA, "tasks": {}, "runs": []}


def load_state(path: Path | None) -> dict[str, Any]:
    """A survey file, or an empty state when there is none (a half-written file cannot exist: every
    write replaces the file atomically)."""
    if path is None or not Path(path).is_file():
        return empty_state()
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ConfigError(f"{path} has schema {data.get('schema')!r}; this version writes {SCHEMA}.",
                          "Move the file away, or pass --state none to start afresh.")
    return data


def newest(*items: dict[str, Any] | None) -> dict[str, Any] | None:
    present = [i for i in items if i]
    return max(present, key=lambda i: i.get("measured_utc", "")) if present else None


def merge_states(*states: dict[str, Any]) -> dict[str, Any]:
    """One state from several (the --state file and a killed run's output): per task and track the
    most recently measured entry wins; a task whose source changed keeps only its newest entry."""
    merged: dict[str, Any] = empty_state()
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


def entry_done(entry: dict[str, Any] | None, want_compile: bool, retry_errors: bool) -> bool:
    """A track's (or the probe's) entry serves when it holds what this run asks for; one that recorded
    an error serves after ERROR_ATTEMPTS tries, or never with `retry_errors`."""
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


def plan(tasks: Sequence[Task], state: dict[str, Any], wanted: Wanted) -> list[tuple[Task, list[str], bool]]:
    """(task, tracks to measure, probe needed) for each task with something left to do."""
    todo = []
    for task in tasks:
        entry = state["tasks"].get(task.task_id)
        if entry is not None and entry["source_sha256"] != task.source_sha256:
            entry = None  # the task changed since it was measured: all of it again
        tracks = [t for t in wanted.tracks if not entry_done((entry or {}).get("tracks", {}).get(t),
                                                              wanted.compile_baseline, wanted.retry_errors)]
        probe = wanted.probe and not probe_done((entry or {}).get("probe"), wanted.retry_errors)
        if tracks or probe:
            todo.append((task, tracks, probe))
    return todo


def task_entry(state: dict[str, Any], task: Task) -> dict[str, Any]:
    """The task's entry in the state, made afresh when the task's source changed."""
    entry = state["tasks"].get(task.task_id)
    if entry is None or entry["source_sha256"] != task.source_sha256:
        entry = {"name": task.name, "level": task.level, "problem_id": task.problem_id,
                 "source_sha256": task.source_sha256, "tracks": {}, "probe": None}
        state["tasks"][task.task_id] = entry
    return entry


def check_device(state: dict[str, Any], info: dict[str, Any]) -> None:
    """One survey file holds one device and one torch version: mixing them would make a table of
    numbers that cannot be compared."""
    here = {"device_name": info["device_name"], "torch_version": info["torch_version"]}
    there = state.get("device")
    if there and state.get("tasks") and there != here:
        raise ConfigError(f"The survey read (--state and --out) was measured on {there['device_name']} with torch"
                          f" {there['torch_version']}; this machine is {here['device_name']} with torch"
                          f" {here['torch_version']}.", "Pass --state none and another --out to start a separate file.")
    state["device"] = here


def write_state(out: Path, state: dict[str, Any], run: dict[str, Any], tasks_left: int, markdown: Any) -> None:
    """`out` (JSON) and the same name with .md, each replaced atomically (tmp file + os.replace);
    `markdown(snapshot)` writes the table."""
    snapshot = dict(state)
    if run["added"]:  # a run that added nothing is not listed
        snapshot["runs"] = [r for r in state["runs"] if r["id"] != run["id"]] + [run]
    snapshot["manifest"] = (snapshot["runs"][-1] if snapshot["runs"] else run)["manifest"]
    snapshot["summary"] = summarize(snapshot, tasks_left)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((out, json.dumps(snapshot, indent=1, default=str)), (out.with_suffix(".md"), markdown(snapshot))):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def summarize(state: dict[str, Any], tasks_left: int) -> dict[str, Any]:
    """Per track (and per level and track) counts and medians, and the probe's verdict over the tasks
    probed in the evaluator's mode."""
    tasks = state.get("tasks", {})
    per_group: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    peaks = (state.get("peaks") or {}).get("peaks")
    for task_id, entry in sorted(tasks.items(), key=lambda kv: task_order(kv[0])):
        for track, row in entry.get("tracks", {}).items():
            row = {**row, "hardware_fraction": hardware_fraction(entry, row, track, peaks)}
            for group in (track, f"level{entry.get('level')} {track}"):
                per_group.setdefault(group, []).append((task_id, row))
    groups = {name: group_stats(rows) for name, rows in per_group.items()}
    return {"tasks": len(tasks), "tasks_left": tasks_left, "groups": groups, "probe": probe_summary(tasks)}


def probe_summary(tasks: dict[str, Any]) -> dict[str, Any]:
    """The flags of record come from probes in the evaluator's mode; the others wait to be probed again."""
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
    return probe


def peaks_of(data: dict[str, Any]) -> Peaks:
    """A Peaks record from its JSON form."""
    return Peaks(**{**data, "measured": tuple(data.get("measured") or ())})


def hardware_fraction(entry: dict[str, Any], row: dict[str, Any], track: str, peaks: dict | None) -> float | None:
    """The fraction of the reference algorithm's work bound (`sol.work_bound_ms`, the bound no honest
    implementation passes) that the faster of eager and torch.compile reaches."""
    trace, times = entry.get("trace") or {}, [t["median_ms"] for t in (row.get("eager"), row.get("compiled")) if t]
    if not peaks or not times or trace.get("flops") is None or trace.get("min_bytes") is None:
        return None
    half = (entry.get("probe") or {}).get("precision") in HALF_DTYPES
    # The stored counts as a trace: the bound reads only its FLOPs and minimum bytes.
    counts = TaskTrace(aten_ops=(), flops=trace["flops"], input_bytes=trace["min_bytes"], param_bytes=0,
                       output_bytes=0, workload_class="", anchor_op=None)
    bound = work_bound_ms(counts, peaks_of(peaks), track, half)
    return bound / min(times) if bound else None


def group_stats(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Counts and medians of one track (or level and track). `beyond_bound` lists the tasks whose eager
    or compiled time is below the speed-of-light bound of the measured peaks, which a very good
    kernel can be (the peaks are rates measured here, not limits); `beyond_hardware_bound` those below
    the work bound, which no correct implementation can be (a wrong FLOP or byte count: check it)."""
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
