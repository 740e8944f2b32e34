"""Evaluation as a service: builds on the CPU cores, one queue per GPU, a task's reference work once.

`Evaluator` owns the processes that evaluations use and keeps them between evaluations of a run:

- a build pool of CPU workers (`build`): each candidate is imported there, confined, and reports its
  kernels' sources, which this process compiles into the build cache (only trusted code writes it:
  confine.py), several at once, beside the GPU's queue; a build error is judged from there and never
  takes a GPU, and on a machine with nvcc and no GPU the agent builds and repairs before it must stop;
- one lane per GPU (`lane`): an evaluation holds a lane for its GPU work, one at a time, so nothing
  else runs on that GPU while it measures. A lane keeps LANE_SPARES spare candidate workers
  starting (their CUDA contexts are created when an evaluation takes its worker or after its
  timing, never during a churn or a measurement: see worker.py) and the
  task's reference processes (reference.py): started at a task's first evaluation on the lane,
  which also measures the task's baselines there (cached per device), then reused by every later
  candidate of the task, until memory makes room for another task's (first those that no queued
  evaluation needs, each group least recently used first);
- reference work ahead (`prepare`): while a task's candidate builds in the pool, an idle lane that
  no evaluation waits for starts the task's reference process and measures its baselines, where
  it fits beside the references held without closing one; the task's first evaluation then finds
  it ready and counts those lane seconds as its own (`prepared`);
- on the CPU device, one lane and no spare (a spare would start on the cores being timed).

The threat analysis of this design is the evaluate package's documentation (evaluate/__init__.py).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from cutegen.config import OWN_KERNEL_BACKENDS
from cutegen.errors import TaskError, ToolchainError
from cutegen.evaluate.baselines import baselines_path, measure_in_reference
from cutegen.evaluate.cache import load_probe, save_json, save_probe
from cutegen.evaluate.confine import build_reported, import_seconds
from cutegen.evaluate.jobs import reference_job
from cutegen.evaluate.sol import cached_peaks
from cutegen.evaluate.worker import Worker, WorkerDied, WorkerPool
from cutegen.evaluate.zygote import Zygote
from cutegen.records import Baselines, Peaks, Task, to_json
from cutegen.runtime import normalize_arch
from cutegen.trace import trace_task

REFERENCE_MEMORY_FRACTION = 0.5  # of a GPU's memory the reference processes of a lane may hold
# Device memory a candidate's worker needs beyond its inputs and outputs (see `_candidate_bytes`): its
# CUDA context, the L2 flush buffer, its forward's temporaries, and the lane's spares' contexts.
CANDIDATE_MARGIN_BYTES = 8 << 30
CPU_LANE_REFERENCES = 4  # reference processes a CPU lane keeps (no device memory to measure)
# PyTorch's out-of-memory message lists the device's processes with the driver's count of their
# memory, which also holds what a process's caching allocator does not report (its CUDA context,
# libraries' workspaces, anything mapped outside torch). A reference process whose count there
# exceeds its own report by more than this holds memory the lane did not know of.
_DRIVER_USE = re.compile(r"Process (\d+) has ([\d.]+) (GiB|MiB) memory in use")
DRIVER_USE_SLACK_BYTES = 2 << 30
# A freed lane goes to a waiter whose task's reference it holds before older waiters, but an
# evaluation passed over this many times goes next: in a beam search two tasks whose references
# were both held kept the lane from a third task's first evaluation for minutes.
MAX_PASSED_OVER = 6
# Spare candidate workers a GPU lane keeps starting: a built candidate's evaluation holds the lane for
# 2-3 s, starting a worker (importing torch, the CUDA context, the profiler) takes 5-9 s on an H200
# whose other cores compile, and with one spare the lane waited for it: 5.6 s of a 10 s median.
LANE_SPARES = 3
CORES_PER_LANE = 2  # cores reserved for a GPU lane's workers when the machine has enough to spare
# The build pool's workers and their compilers run at this niceness: a lane's spare worker and the
# next reference process import torch on the same cores while fourteen compilers run there, and
# waiting for those imports held the GPU's lane for up to 9 s per evaluation on an H200.
BUILD_NICE = 10


@dataclass
class ReferenceProcess:
    """A task's reference process on one lane and what it reported."""

    key: tuple
    worker: Any
    job: dict[str, Any]
    data: dict[str, Any]  # the reply to `reference`: spec, leaves, trials, weights, tolerance...
    degenerate: tuple[str, ...]
    baselines: Baselines | None = None
    peaks: Peaks | None = None
    measured: bool = False  # baselines and peaks looked up (from the caches or measured)
    memory_bytes: int = 0
    trimmed_bytes: int = 0  # memory_bytes after the baselines (it grows as the process serves candidates)
    evaluations: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    # The steps' seconds of a preparation ahead of the task's first evaluation (Lane.prepare), with
    # `prepared`, the lane seconds it took: the first evaluation that takes the process reports them.
    ahead: dict[str, float] = field(default_factory=dict)


def reference_key(task: Task, config: Any) -> tuple:
    """What a reference process depends on: the task and the settings its trials were made with."""
    return (task.task_id, task.source_sha256, config.device, config.track, config.correctness_trials,
            config.adversarial_trials, config.weight_seeds, config.timing_input_sets, config.atol, config.rtol)


class Lane:
    """One GPU (or the CPU): its candidate workers, its reference processes, one evaluation at a time."""

    def __init__(self, evaluator: "Evaluator", gpu: int | None, cpus: tuple[int, ...] | None,
                 spare_cpus: tuple[int, ...] | None = None) -> None:
        self.evaluator, self.gpu, self.cpus, self.spare_cpus = evaluator, gpu, cpus, spare_cpus
        cuda = evaluator.device == "cuda"
        self.pool = WorkerPool(evaluator.device, (gpu,) if cuda else (0,), log_tail_bytes=evaluator.log_tail_bytes,
                               warm_spares=cuda, cpus=cpus, spare_cpus=spare_cpus,
                               spares=LANE_SPARES if cuda else 1, zygote=evaluator.zygote)
        # The spares warm up (CUDA context, profiler) when the evaluation asks, right after the parent's
        # clock is calibrated (pipeline.py), not when the worker is taken: the calibration must wait for
        # a warm-up in progress, and waited 4.2 s an evaluation for it on the H200 (bench/results, part I).
        self.references: collections.OrderedDict[tuple, ReferenceProcess] = collections.OrderedDict()
        self.busy = False
        self.ending_at_start = 0  # workers still ending when the current candidate's worker started
        # The next task's reference process, started ahead (importing torch, and torch.compile's
        # machinery for the baselines: seconds of CPU, nothing on the GPU until its first command).
        self.reference_spare: Any = None

    # -- reference processes

    def reference(self, task: Task, config: Any) -> ReferenceProcess:
        """The task's reference process on this lane: kept, or started now (reference, probe,
        baselines, peaks); its `seconds` say what this call spent. A failure of the reference is the
        task's (TaskError)."""
        key = reference_key(task, config)
        ref = self.references.get(key)
        if ref is not None and not ref.worker.closed:
            self.references.move_to_end(key)
            ref.seconds, ref.ahead = ref.ahead, {}
            return ref
        if ref is not None:
            self.drop(ref)
        started = time.perf_counter()
        # A CPU lane counts its references, not bytes: no trace (which imports torch into this process).
        self._make_room(need=_reference_bytes(task, config) if self.evaluator.device == "cuda" else 0)
        # The last candidate's worker may still be ending in the background with tens of GB of the
        # device: a reference that allocated beside it ran out of memory and kept its outputs on the
        # host, where every comparison of a gigabyte task then took minutes.
        self.pool.wait_closed()
        make_room_s = time.perf_counter() - started  # closing processes that held gigabytes takes seconds
        ref = self._start_reference(task, config, key)
        ref.seconds = {"make_room": round(make_room_s, 3), **ref.seconds}
        self.references[key] = ref
        return ref

    def _start_reference(self, task: Task, config: Any, key: tuple) -> ReferenceProcess:
        started = time.perf_counter()
        cached = load_probe(config.cache_dir, task, config.track)
        job = reference_job(task, config, trials=config.correctness_trials, adversarial=config.adversarial_trials,
                            weight_seeds=config.weight_seeds, probe=cached is None)
        compile_warm = config.do_timing and config.compile_baseline

        def spawn() -> Any:
            return Worker(self.evaluator.device, self.gpu, self.evaluator.log_tail_bytes, warm_profiler=False,
                          warm_compile=compile_warm, cpus=self.spare_cpus or self.cpus, zygote=self.evaluator.zygote)

        worker, self.reference_spare = self.reference_spare, None
        if worker is None or worker.closed or worker.process.poll() is not None:
            worker = spawn()
        worker.pin(self.cpus)
        if self.evaluator.device == "cuda":  # on the CPU a spare would start on the cores being timed
            self.reference_spare = spawn()
        try:
            reply = worker.call("reference", job, timeout_s=config.reference_timeout_s)
        except WorkerDied as died:
            raise TaskError(f"The reference of task {task.task_id} did not complete in its process: {died.detail}."
                            f"\n{died.log_tail[-1500:]}", "Run the task file on its own and check that its"
                            " reference completes (or raise the reference timeout).") from None
        if not reply["ok"]:
            worker.close()
            error = reply["error"]
            raise TaskError(f"The reference of task {task.task_id} raised {error.get('type')}: "
                            f"{error.get('message', '')[:1500]}", "Run the task file on its own and fix it.")
        data = reply["data"]
        degenerate = cached if cached is not None else tuple(data["degenerate"] or ())
        if cached is None:
            save_probe(config.cache_dir, task, config.track, degenerate)
        ref = ReferenceProcess(key, worker, job, data, degenerate, memory_bytes=int(data.get("memory_bytes") or 0))
        ref.seconds["reference"] = round(time.perf_counter() - started, 3)
        return ref

    def ready_reference(self, task: Task, config: Any, replace_bloated: bool = True) -> ReferenceProcess:
        """`reference`, with the task's baselines and the device's peaks looked up once per
        reference process: from the caches, or measured in the reference process on its timing
        inputs, which it then drops. torch.compile that takes the process down is recorded as the
        compile baseline's error, and eager is measured in a new reference process. A process that
        holds far more after its baselines than what it keeps (`_bloated`) is replaced once by one
        that finds the baselines in the cache."""

        ref = self.reference(task, config)
        if ref.measured or not config.do_timing:
            return ref
        seconds, started = dict(ref.seconds), time.perf_counter()
        baselines, died = measure_in_reference(task, config, ref.worker, ref.worker.info, self.settle,
                                               seconds.get("reference", 0.0))
        if died is not None:
            self.drop(ref)
            ref = self.reference(task, config)
            seconds["reference"] = seconds.get("reference", 0.0) + ref.seconds.get("reference", 0.0)
            info = ref.worker.info
            baselines, _ = measure_in_reference(task, replace(config, compile_baseline=False), ref.worker, info,
                                                self.settle, ref.seconds.get("reference", 0.0))
            if baselines is not None:
                baselines = replace(baselines, compile_error=died)
                save_json(baselines_path(config.cache_dir, task, config.track, info["device_name"],
                                         info["torch_version"]), to_json(baselines))
        ref.baselines = baselines
        seconds["baselines"] = round(time.perf_counter() - started, 3)
        if self.evaluator.device == "cuda":
            started = time.perf_counter()
            ref.peaks = cached_peaks(config.cache_dir, ref.worker.info,
                                     lambda: ref.worker.call("peaks", timeout_s=config.run_timeout_s))
            seconds["peaks"] = round(time.perf_counter() - started, 3)
        reply = ref.worker.call("trim", timeout_s=config.run_timeout_s)
        if reply.get("ok"):
            ref.memory_bytes = int(reply["data"].get("memory_bytes") or 0)
        ref.trimmed_bytes = ref.memory_bytes
        ref.measured, ref.seconds = True, seconds
        if replace_bloated and _bloated(task, config, ref.trimmed_bytes):
            self.drop(ref)
            fresh = self.ready_reference(task, config, replace_bloated=False)
            fresh.seconds = {step: round(seconds.get(step, 0.0) + fresh.seconds.get(step, 0.0), 3)
                             for step in {**seconds, **fresh.seconds}}
            return fresh
        return ref

    def prepare(self, task: Task, config: Any) -> bool:
        """`ready_reference` ahead of the task's first evaluation, only where the task's reference
        fits beside the lane's without closing one (a prepared reference that pushed out another
        task's would cost that task its reference again); whether it was prepared. The caller holds
        the lane. A failure is left to the task's evaluation, which meets it again and reports it."""
        if reference_key(task, config) in self.references or self._full(_reference_bytes(task, config)):
            return False
        started = time.perf_counter()
        ref = self.ready_reference(task, config)
        ref.ahead = {**ref.seconds, "prepared": round(time.perf_counter() - started, 3)}
        return True

    def drop(self, ref: ReferenceProcess) -> None:
        """Close a reference process (after it died, broke, or to make room)."""
        self.references.pop(ref.key, None)
        ref.worker.close()

    def _make_room(self, need: int) -> None:
        """Before a new reference process starts: close others (`_eviction_order`) while the lane's
        would hold more than REFERENCE_MEMORY_FRACTION of the GPU's memory with `need` more bytes
        (CPU lanes: while they number CPU_LANE_REFERENCES or more). The rest of the GPU is the
        candidate's: its inputs, outputs and timing sets."""
        for ref in self._eviction_order():
            if not self._full(need):
                break
            self.drop(ref)

    def _eviction_order(self, keep: ReferenceProcess | None = None) -> list[ReferenceProcess]:
        """The lane's reference processes other than `keep`, in the order they are closed for room:
        those of tasks no waiting evaluation needs first, then the others, each least recently used
        first. Closing one whose task still has candidates in the queue costs that task its reference
        work again (about 14 s of a full-size KernelBench task on the H200, bench/results part I)."""
        wanted = self.evaluator.waiting_tasks()
        refs = [r for r in self.references.values() if r is not keep]  # least recently used first
        return sorted(refs, key=lambda r: tuple(r.key[:2]) in wanted)  # stable: LRU within each group

    def _full(self, need: int) -> bool:
        """Whether the lane's reference processes and `need` more bytes would hold more than
        REFERENCE_MEMORY_FRACTION of the GPU's memory (CPU lanes: whether they number
        CPU_LANE_REFERENCES or more)."""
        total = int(self.pool.info().get("total_memory") or 0) if self.evaluator.device == "cuda" else 0
        if total:
            return self._held_bytes() + need > REFERENCE_MEMORY_FRACTION * total
        return len(self.references) >= CPU_LANE_REFERENCES

    def _held_bytes(self) -> int:
        """What the lane's reference processes hold, by their latest reports."""
        return sum(r.memory_bytes for r in self.references.values())

    def candidate_room(self, task: Task, config: Any, ref: ReferenceProcess) -> None:
        """Before a candidate's worker starts: close other tasks' reference processes (in
        `_eviction_order`) while they, this task's and what the candidate needs (`_candidate_bytes`)
        would not fit in the GPU's memory, and wait for the last candidate's worker to end when the two
        candidates would not fit side by side. (A reference grows after its baselines, by its
        comparisons' and the ghost probe's work: its replies report its memory. On an H200, two
        other tasks' references held 121 GB while an honest candidate ran out of memory.)"""
        if self.evaluator.device != "cuda":
            return
        total = int(self.pool.info().get("total_memory") or 0)
        need = _candidate_bytes(task, config)
        if total and need:
            for other in self._eviction_order(keep=ref):
                if self._held_bytes() + need <= total:
                    break
                self.drop(other)
            if self._held_bytes() + 2 * need > total:
                self.pool.wait_closed()
        self.ending_at_start = self.pool.closing()

    def release_memory(self, message: str = "") -> str:
        """After a candidate ran out of device memory: close the lane's reference processes and wait
        for its ending workers, when that frees something the candidate could have used (other
        tasks' references; this task's grown by more than 1 GiB past its size after the baselines,
        or holding more than it reports by the driver's count in the out-of-memory `message`; a
        worker still ending). Says what was freed; "" when nothing would be (the candidate is then
        judged as it is)."""
        refs = list(self.references.values())
        use = driver_use(message)
        held = {id(r): max(r.memory_bytes, use.get(_pid(r), 0)) for r in refs}
        grown = [r for r in refs if r.memory_bytes > r.trimmed_bytes + (1 << 30)
                 or held[id(r)] > r.memory_bytes + DRIVER_USE_SLACK_BYTES]
        ending = self.ending_at_start  # (the candidate's own worker is ending now: not counted)
        if len(refs) < 2 and not grown and not ending:
            return ""
        for ref in refs:
            self.drop(ref)
        self.pool.wait_closed()
        parts = [f"{sum(held.values()) / 2**30:.1f} GiB in {len(refs)} reference process(es)"] + \
            [f"{ending} ending worker(s)"] * bool(ending)
        return " and ".join(parts)

    # -- candidates

    @contextlib.contextmanager
    def candidate_worker(self) -> Iterator[Any]:
        with self.pool.worker() as worker:
            worker.settle = self.settle
            yield worker

    def settle(self) -> dict[str, float]:
        """Wait until no worker of this lane is starting (see WorkerPool._settle), the reference
        spare included; the seconds of each wait, by what was waited for."""

        waits = self.pool._settle(0)
        spare = self.reference_spare
        started = time.perf_counter()
        if spare is not None and not self.pool._spares_apart():
            try:
                spare.wait_started()
            except (ToolchainError, WorkerDied):
                self.reference_spare = None
        return {**waits, "reference_spare": time.perf_counter() - started}

    def warm_spare(self, younger: bool = True) -> None:
        self.pool.warm_spare(younger=younger)

    def close(self) -> None:
        for ref in list(self.references.values()):
            self.drop(ref)
        if self.reference_spare is not None:
            self.reference_spare.kill()
        self.pool.close()


class Evaluator:
    """The processes of a run's evaluations (module docstring). Thread-safe: the agent evaluates
    several candidates at once; each holds a lane only for its GPU work."""

    def __init__(self, device: str = "cuda", gpus: tuple[int, ...] = (0,), *, build_jobs: int | None = None,
                 log_tail_bytes: int = 16384, pin_cpus: bool = True, prepare_ahead: bool | None = None,
                 fork_server: bool = True) -> None:
        """`prepare_ahead`: whether `prepare` starts a task's reference work on an idle lane while
        its candidate builds (default: on a GPU; a CPU lane's reference would share the cores with
        the builds). `fork_server`: whether workers that never touch a GPU (the build workers; every
        worker of a CPU evaluator) are forked from a zygote that imported torch once (zygote.py)
        instead of each starting a fresh interpreter."""

        self.device, self.log_tail_bytes = device, log_tail_bytes
        self.zygote = Zygote() if fork_server else None
        self.prepare_ahead = device == "cuda" if prepare_ahead is None else prepare_ahead
        lanes = list(gpus) if device == "cuda" else [None]
        lane_cpus, build_cpus = _split_cores(len(lanes), pin_cpus and device == "cuda")
        self.lanes = [Lane(self, gpu, cpus, build_cpus) for gpu, cpus in zip(lanes, lane_cpus)]
        cores = len(build_cpus) if build_cpus else (os.cpu_count() or 2)
        self.build_jobs = max(1, build_jobs if build_jobs is not None else max(1, cores - 1))
        self.builds = WorkerPool("cpu", cpu_slots=self.build_jobs, log_tail_bytes=log_tail_bytes,
                                 warm_spares=False, warm_profiler=False, cpus=build_cpus, nice=BUILD_NICE,
                                 zygote=self.zygote)
        # The compilers of the candidates' kernels, run by this (trusted) process into the build cache,
        # which the confined build workers may not write (confine.py); niced like the build pool.
        self.compilers = ThreadPoolExecutor(self.build_jobs, thread_name_prefix="cutegen-compile",
                                            initializer=_lower_priority, initargs=(BUILD_NICE,))
        self._cond = threading.Condition()
        self._tickets = 0
        self._waiting: dict[int, tuple[str, str]] = {}  # ticket -> (task id, source hash) of a waiting evaluation
        self._passed_over: dict[int, int] = {}  # ticket -> lanes given to a later waiter meanwhile
        self._arch: str | None = None
        self.transfer = "auto"  # how candidates export outputs: "file" once CUDA IPC failed where it never worked
        self.ipc_worked = False  # whether the reference process ever opened a candidate's outputs by CUDA IPC
        # (what, label, start, end) in time.monotonic() seconds: each build in the pool, each hold of a
        # lane by an evaluation and each preparation ahead, for a run's report of where time went and
        # what overlapped (bounded: a long run keeps the latest).
        self.timeline: collections.deque[tuple[str, str, float, float]] = collections.deque(maxlen=100_000)
        self._to_prepare: list[tuple[Task, Any]] = []  # (task, config) in the order they were asked for
        self._preparer: threading.Thread | None = None
        self._closed = False

    @classmethod
    def for_config(cls, config: Any, **kwargs: Any) -> "Evaluator":
        return cls(config.device, tuple(config.gpus), log_tail_bytes=config.log_tail_bytes, **kwargs)

    def with_arch(self, config: Any) -> Any:
        """`config` with the build architecture read from the device when it is not set, so that the
        build pool (which has no GPU) and the candidate's worker compile for, and look up builds
        under, the same key. Unchanged without a device (the build pool then cannot build: the
        evaluation stops where it needs the device) or when nothing is built (backend torch)."""

        if config.device != "cuda" or config.backend not in OWN_KERNEL_BACKENDS or config.runtime.arch:
            return config
        with self._cond:
            if self._arch is None:
                capability = self.lanes[0].pool.info().get("capability")
                self._arch = normalize_arch(f"sm_{capability[0]}{capability[1]}") if capability else ""
        return replace(config, runtime=replace(config.runtime, arch=self._arch)) if self._arch else config

    def build(self, source: str, config: Any, label: str = "") -> dict[str, Any]:
        """Import the candidate in a confined CPU worker (no GPU), which reports its kernels' sources,
        and compile them here into the build cache (confine.build_reported, in the niced compiler
        threads): no candidate code runs in a process that may write the cache. The reply, with
        `conclusive` False when the failure may be this machine's and not the candidate's (an import
        that needs a GPU, a load_inline build where torch has no CUDA): then the GPU's worker builds
        again and judges."""

        payload = {"source": source, "runtime": to_json(config.runtime), "guard": config.guard,
                   "landlock": config.confinement != "hashes"}
        started, began = time.perf_counter(), time.monotonic()
        try:
            with self.builds.worker() as worker:
                reply = worker.call("prebuild", payload, timeout_s=config.build_timeout_s,
                                    timeout_reason="build_timeout")
                reply["log_tail"] = worker.log_tail()
            remaining_s = max(1.0, config.build_timeout_s - import_seconds(reply))  # the import counts, as before
            reply = {**self.compilers.submit(build_reported, reply, config.runtime, remaining_s).result(),
                     "log_tail": reply["log_tail"]}
        except WorkerDied as died:
            reply = {"ok": False, "died": died.reason, "detail": died.detail, "log_tail": died.log_tail}
        reply["wall_s"] = round(time.perf_counter() - started, 3)
        self.timeline.append(("build", label, began, time.monotonic()))
        error = reply.get("error") or {}
        reply["conclusive"] = bool(reply.get("ok")) or reply.get("died") == "build_timeout" or (
            error.get("kind") == "build_error" and error.get("type") == "BuildError")
        return reply

    @contextlib.contextmanager
    def lane(self, task: Task) -> Iterator[Lane]:
        """A lane for one evaluation's GPU work, held until the block ends. A freed lane goes to the
        evaluation waiting longest among those whose task's reference process it holds, else to the
        one waiting longest: a task's candidates follow each other while its reference is kept; but
        the longest waiter goes first once it has been passed over MAX_PASSED_OVER times."""
        with self._cond:
            ticket = self._tickets = self._tickets + 1
            self._waiting[ticket] = (task.task_id, task.source_sha256)
            # the task's reference work is this evaluation's now: a request ahead for it is void
            self._to_prepare = [(t, c) for t, c in self._to_prepare
                                if (t.task_id, t.source_sha256) != self._waiting[ticket]]
            while (lane := self._free_lane_for(ticket)) is None:
                self._cond.wait()
            del self._waiting[ticket]
            self._passed_over.pop(ticket, None)
            for earlier in (t for t in self._waiting if t < ticket):
                self._passed_over[earlier] = self._passed_over.get(earlier, 0) + 1
            lane.busy = True
            self._cond.notify_all()  # the other waiters look again: another lane may be free for them
        began = time.monotonic()
        try:
            yield lane
        finally:
            self.timeline.append(("lane", task.task_id, began, time.monotonic()))
            with self._cond:
                lane.busy = False
                self._cond.notify_all()

    def prepare(self, task: Task, config: Any) -> None:
        """Ask for the task's reference work ahead (module docstring): a background thread takes a
        free lane for it when no evaluation waits for one; the request is dropped once the task's
        evaluation asks for a lane or a lane holds its reference. `config` must be the one the evaluation
        will use (after `with_arch`), as the reference is kept under its settings."""
        if not self.prepare_ahead:
            return
        key = reference_key(task, config)
        with self._cond:
            if self._closed or self._held(key) or any(reference_key(*asked) == key for asked in self._to_prepare):
                return
            self._to_prepare.append((task, config))
            if self._preparer is None:
                self._preparer = threading.Thread(target=self._prepare_loop, name="cutegen-prepare", daemon=True)
                self._preparer.start()
            self._cond.notify_all()

    def waiting_tasks(self) -> set[tuple[str, str]]:
        """(task id, source hash) of each task an evaluation waits for a lane for."""
        with self._cond:
            return set(self._waiting.values())

    def _held(self, key: tuple) -> bool:
        """Whether a lane holds the reference process kept under `key`."""
        return any(key in lane.references for lane in self.lanes)

    def _prepare_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    self._to_prepare = [(t, c) for t, c in self._to_prepare if not self._held(reference_key(t, c))]
                    free = [lane for lane in self.lanes if not lane.busy]
                    if self._to_prepare and free and not self._waiting:
                        break
                    self._cond.wait()
                task, config = self._to_prepare.pop(0)
                lane = free[0]
                lane.busy = True
            began, prepared = time.monotonic(), False
            try:
                prepared = lane.prepare(task, config)
            except Exception:  # noqa: BLE001 - the task's evaluation meets the failure again and reports it
                pass
            finally:
                if prepared:
                    self.timeline.append(("prepare", task.task_id, began, time.monotonic()))
                with self._cond:
                    lane.busy = False
                    self._cond.notify_all()

    def _free_lane_for(self, ticket: int) -> Lane | None:
        """The free lane whose best waiter is `ticket`, if any (under the condition's lock)."""
        for lane in self.lanes:
            if lane.busy:
                continue
            held = {key[:2] for key in lane.references}
            oldest = min(self._waiting)
            best = oldest if self._passed_over.get(oldest, 0) >= MAX_PASSED_OVER else \
                min(self._waiting, key=lambda t: (self._waiting[t] not in held, t))
            if best == ticket:
                return lane
        return None

    def close(self) -> None:
        with self._cond:
            self._closed, self._to_prepare = True, []
            self._cond.notify_all()
            preparer = self._preparer
        if preparer is not None:  # a preparation under way ends first: it holds a lane's processes
            preparer.join()
        for lane in self.lanes:
            lane.close()
        self.builds.close()
        if self.zygote is not None:
            self.zygote.close()
        self.compilers.shutdown(wait=True)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _lower_priority(nice: int) -> None:
    """Give the calling thread (a compiler thread) a lower priority: the compilers it starts inherit it."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def driver_use(message: str) -> dict[int, int]:
    """Bytes in use per process id, as an out-of-memory message of PyTorch lists them."""
    unit = {"GiB": 1 << 30, "MiB": 1 << 20}
    return {int(pid): int(float(size) * unit[scale]) for pid, size, scale in _DRIVER_USE.findall(message)}


def _pid(ref: ReferenceProcess) -> int | None:
    return getattr(getattr(ref.worker, "process", None), "pid", None)


def _trace_bytes(task: Task) -> tuple[int, int, int] | None:
    """(input, output, parameter) bytes of one forward, from the task's trace (no memory, no
    arithmetic); None when the trace cannot say."""

    trace = trace_task(task)
    if trace.output_bytes is None or trace.input_bytes is None:
        return None
    return trace.input_bytes, trace.output_bytes, trace.param_bytes or 0


def _reference_bytes(task: Task, config: Any) -> int:
    """What a task's reference process will hold on the device: every trial's outputs, and trial 0's
    and the timing trials' inputs (until the baselines are measured); 0 when the trace cannot say."""
    sizes = _trace_bytes(task)
    if sizes is None:
        return 0
    inputs, outputs, params = sizes
    trials = config.correctness_trials + config.adversarial_trials
    return trials * outputs + (config.timing_input_sets + 1) * inputs + params


# A reference process after `trim` may hold this much more than its trials' outputs, trial 0's inputs
# and its models (allocator rounding, the ghost probe's masks later) before it is replaced. On an H200,
# level1/36's reference was listed with 98.6 GiB beside a candidate that ran out of memory, where the
# same reference measured alone held 49 GiB after `trim`; a replaced process finds the baselines in
# the cache and does not measure them again.
BLOATED_FACTOR = 1.25
BLOATED_MARGIN_BYTES = 2 << 30


def _bloated(task: Task, config: Any, held: int) -> bool:
    """Whether a reference process holding `held` bytes after `trim` holds far more than it keeps
    (False when the trace cannot say, or on a CPU, where nothing is measured)."""
    sizes = _trace_bytes(task) if held else None
    if sizes is None:
        return False
    inputs, outputs, params = sizes
    kept = (config.correctness_trials + config.adversarial_trials) * outputs + inputs + config.weight_seeds * params
    return held > BLOATED_FACTOR * kept + BLOATED_MARGIN_BYTES


def _candidate_bytes(task: Task, config: Any) -> int:
    """What a candidate's worker holds on the device at most: during a correctness trial its inputs
    twice (a pristine copy) and two outputs' worth (its own and its forward's temporaries); during
    timing every timing input set, the outputs kept for checking and one in flight; plus
    CANDIDATE_MARGIN_BYTES. 0 when the trace cannot say."""
    sizes = _trace_bytes(task)
    if sizes is None:
        return 0
    inputs, outputs, params = sizes
    correctness = 2 * inputs + 2 * outputs
    timing = config.timing_input_sets * inputs + (config.timed_output_checks + 2) * outputs
    return max(correctness, timing) + 2 * params + CANDIDATE_MARGIN_BYTES


def _split_cores(lanes: int, pin: bool) -> tuple[list[tuple[int, ...] | None], tuple[int, ...] | None]:
    """(cores of each lane's workers, cores of the build pool). Each GPU lane gets CORES_PER_LANE
    cores of its own when at least four are left for builds (a compiler on the core of a timed
    process delays its launches); otherwise nothing is pinned."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [None] * lanes, None
    if not pin or len(cores) - lanes * CORES_PER_LANE < 4:
        return [None] * lanes, None
    lane_cpus = [tuple(cores[i * CORES_PER_LANE:(i + 1) * CORES_PER_LANE]) for i in range(lanes)]
    return lane_cpus, tuple(cores[lanes * CORES_PER_LANE:])
