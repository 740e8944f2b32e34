"""Baselines: eager PyTorch and torch.compile, timed by the candidates' own protocol.

Both are timed in a worker with the precision track's settings (`timing.time_forward`, the same
function that times candidates), on inputs drawn like the candidates' timing inputs. Eager is
timed twice in each measurement; the spread of the two medians is the noise floor of the run (a
difference between candidates smaller than it is not a gain). torch.compile uses the default
(inductor) backend; when it fails or hangs, the error is recorded and eager still counts. Results
are cached per (task source hash, track, device name, torch version), one JSON file per key written
atomically, so `cutegen baseline` over a suite resumes where it stopped. A suite's baselines share
one worker (`BaselineWorker`), which never sees a candidate.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from cutegen.errors import TaskError
from cutegen.evaluate.cache import load_json, save_json, slug
from cutegen.evaluate.jobs import reference_job, timing_spec
from cutegen.evaluate.timing import summarize
from cutegen.evaluate.worker import WorkerDied
from cutegen.records import Baselines, Task, TimingStats, from_json, to_json

_MAX_ERROR = 2000  # characters of a compile error kept in a record


def baselines_path(cache_dir: Path, task: Task, track: str, device_name: str, torch_version: str) -> Path:
    name = f"{slug(task.task_id)}-{task.source_sha256[:16]}-{track}-{slug(device_name)}-torch{slug(torch_version)}"
    return Path(cache_dir) / "baselines" / f"{name}.json"


def load_baselines(path: Path) -> Baselines | None:
    data = load_json(path)
    try:
        return from_json(Baselines, data) if isinstance(data, dict) else None
    except TypeError:
        return None


def _satisfies(cached: Baselines | None, config: Any) -> bool:
    """A cached record serves when it holds what this configuration asks for."""
    if cached is None:
        return False
    if config.eager_baseline and cached.eager is None:
        return False
    return not (config.compile_baseline and cached.compiled is None and cached.compile_error is None)


def noise_pct(first: TimingStats | None, second: TimingStats | None) -> float | None:
    if first is None or second is None or min(first.median_ms, second.median_ms) <= 0:
        return None
    return abs(first.median_ms - second.median_ms) / min(first.median_ms, second.median_ms) * 100.0


class BaselineWorker:
    """One worker for the baseline measurements of task after task.

    A baseline job runs only the task's reference, which is trusted like the task file itself, and
    its worker refuses a candidate (a reference process never takes a candidate's job; see
    protocol.py), so the rule that gives every candidate a fresh process is not needed between
    baselines. After each task the worker drops the
    task's session (`release`: its tensors, compiled model and torch.compile's in-process caches) and
    the next task reuses the process, its CUDA context and torch.compile's loaded machinery. (With a
    fresh worker per task, a median H200 measurement of 17.6 s waited 3.2 s for the next worker to
    start and spent 8.0 s in a torch.compile whose every graph came from the cache.) A worker
    that died, whose CUDA context broke, that still holds device memory after a release, or whose
    task changed torch's global state (a flag, the default dtype, a patched function) is closed, and
    the next task takes a fresh one from the pool.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.worker: Any = None
        self._lease: contextlib.ExitStack | None = None

    def take(self) -> Any:
        """The held worker, or a fresh one from the pool when there is none."""
        if self.worker is None:
            self._lease = contextlib.ExitStack()
            self.worker = self._lease.enter_context(self.pool.worker())
        return self.worker

    def release(self, timeout_s: float) -> None:
        """After a task: keep the worker for the next one, or close it when it cannot serve."""

        if self.worker is None:
            return
        if not self.worker.closed:
            try:
                reply = self.worker.call("release", timeout_s=timeout_s)
            except WorkerDied:
                reply = {}
            data = reply.get("data") or {}
            if reply.get("ok") and reply.get("cuda_ok", True) and not data.get("allocated_bytes") \
                    and not data.get("state_changes"):
                return
        self.drop()

    def drop(self) -> None:
        """Close the held worker (a dead one is only reaped)."""
        lease, self._lease, self.worker = self._lease, None, None
        if lease is not None:
            lease.close()

    def __enter__(self) -> "BaselineWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop()


def get_baselines(task: Task, config: Any, pool: Any, held: BaselineWorker | None = None) -> Baselines | None:
    """The task's baselines from the cache, or measured now and cached: in `held`'s worker when given
    (a suite's tasks share it), else in a fresh worker from `pool`."""
    if not (config.eager_baseline or config.compile_baseline):
        return None
    info = pool.info()
    path = baselines_path(config.cache_dir, task, config.track, info["device_name"], info["torch_version"])
    cached = load_baselines(path)
    if _satisfies(cached, config):
        return cached
    with contextlib.ExitStack() as stack:
        if held is None:
            held = stack.enter_context(BaselineWorker(pool))
        try:
            baselines, compile_died = _measure(task, config, held.take(), config.compile_baseline)
            if compile_died is not None:  # the compile ended its worker before eager was timed: eager in a new one
                held.drop()
                baselines, _ = _measure(task, config, held.take(), False)
                baselines = replace(baselines, compile_error=compile_died)
        finally:
            held.release(config.run_timeout_s)
    save_json(path, to_json(baselines))
    return baselines


def measure_in_reference(task: Task, config: Any, worker: Any, info: dict[str, Any], settle: Any,
                         reference_s: float | None = None) -> tuple[Baselines | None, str | None]:
    """The task's baselines from the cache, or measured in its reference process (service.py), which
    already holds the timing inputs: (baselines, None), or (eager-less baselines or None, why the
    process died) when torch.compile killed or hung it (the caller starts a new reference process
    and measures eager there with `compile_baseline` off). `reference_s`: what the reference process's
    start cost, recorded as the measurement's reference seconds."""
    if not (config.eager_baseline or config.compile_baseline):
        return None, None
    path = baselines_path(config.cache_dir, task, config.track, info["device_name"], info["torch_version"])
    cached = load_baselines(path)
    if _satisfies(cached, config):
        return cached, None
    worker.settle = settle
    baselines, died = _measure(task, config, worker, config.compile_baseline, reference_s=reference_s)
    if died is None:
        save_json(path, to_json(baselines))
    return baselines, died


def _measure(task: Task, config: Any, worker: Any, compile_it: bool,
             reference_s: float | None = None) -> tuple[Baselines, str | None]:
    """The baselines in one worker: reference (unless `reference_s` says what it cost already: a
    task's reference process, which holds the timing inputs),
    compile, settle, eager twice, compiled. The compile comes before the settle, so that the pool's
    new spare starts while it runs (the wait for the spare took 3.2 s of each 17.6 s measurement on
    an H200 when it came after the reference alone) and nothing is timed while either is busy.
    Returns (baselines, None), or (eager-less baselines, why the worker died) when the compile
    killed or hung the worker before eager was timed."""

    spec = timing_spec(config)
    seconds: dict[str, float] = {} if reference_s is None else {"reference_s": round(reference_s, 3)}
    worker_job: int | None = None
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name], clock = round(time.perf_counter() - clock, 3), time.perf_counter()

    def record(eager: Any = None, repeat: Any = None, compiled: Any = None, error: str | None = None) -> Baselines:
        return Baselines(task.task_id, task.source_sha256, config.track, worker.info["device_name"],
                         worker.info["torch_version"], eager, repeat, compiled, error, noise_pct(eager, repeat),
                         **seconds, worker_job=worker_job)

    error = None
    try:
        if reference_s is None:
            job = reference_job(task, config, trials=config.timing_input_sets, adversarial=0, weight_seeds=1,
                                probe=False, exact=False, reusable=True)
            reference = _require(task, worker.call("reference", job, timeout_s=config.reference_timeout_s),
                                 "its reference")
            worker_job = reference.get("worker_job")
            lap("reference_s")
        if compile_it:
            try:
                reply = worker.call("baseline", {"kind": "compile", "timing": spec}, timeout_s=config.run_timeout_s)
            except WorkerDied as died:  # a compile that hangs or crashes: eager still counts
                return record(), f"{died.reason}: {died.detail}"
            error = (reply.get("data") or {}).get("compile_error") if reply.get("ok") else \
                str(reply.get("error", ""))[:_MAX_ERROR]
            lap("compile_s")
        worker.settle()
        lap("settle_s")
        eager = repeat = None
        if config.eager_baseline:
            data = _require(task, worker.call("baseline", {"kind": "eager", "timing": spec}, timeout_s=config.run_timeout_s),
                            "the eager baseline")
            eager, repeat = summarize(data["eager"]), summarize(data["eager_repeat"])
            lap("eager_s")
    except WorkerDied as died:
        raise TaskError(
            f"Measuring the baseline of task {task.task_id} failed: {died.detail}.\n{died.log_tail[-1500:]}",
            "Run the task file on its own to check that its reference completes on this device.",
        ) from None
    compiled = None
    if compile_it and error is None:
        try:
            reply = worker.call("baseline", {"kind": "compiled", "timing": spec}, timeout_s=config.run_timeout_s)
        except WorkerDied as died:  # the compiled model hangs or crashes when run again
            reply = {"ok": True, "data": {"compiled": None, "compile_error": f"{died.reason}: {died.detail}"}}
        data = reply.get("data") or {"compiled": None, "compile_error": str(reply.get("error", ""))[:_MAX_ERROR]}
        compiled = summarize(data["compiled"]) if data.get("compiled") else None
        error = data.get("compile_error")
        lap("compiled_s")
    return record(eager, repeat, compiled, error), None


def _require(task: Task, reply: dict[str, Any], what: str) -> dict[str, Any]:
    if reply.get("ok"):
        return reply["data"]
    error = reply.get("error", {})
    raise TaskError(
        f"Task {task.task_id} failed while measuring {what}: {error.get('type')}: {error.get('message')}",
        "Run the task file on its own (`python TASK.py` with a small driver) and fix the reference.",
    )
