"""Measuring one (task, track): the baselines through the evaluator's own path, the speed-of-light
fields, and the parallel precompile that pays torch.compile's CPU work ahead.

torch.compile's CPU work (inductor and triton compiles: 20-30 s for a small task) would dominate a
survey, so a chunk of (task, track)s is compiled first by several evaluator workers at once (processes
on the same device, kept for the whole run, each compiling with one thread), each building the
reference and its inputs exactly as the baseline worker does (its `reference` command with one input
set, then `baseline` with kind `compile`, the one call that compiles, then `release`). That fills the
FX graph, AOT autograd and triton caches (one folder the caller names in TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR before any worker starts), so the measured compile is a cache hit. Triton's
autotuning choices found while the device was shared are deleted before the chunk is measured, so the
measured compile tunes on an idle device, as it would alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from cutegen.config import HALF_DTYPES, EvalConfig
from cutegen.errors import TaskError, ToolchainError
from cutegen.evaluate.baselines import BaselineWorker, get_baselines
from cutegen.evaluate.jobs import reference_job
from cutegen.evaluate.protocol import cuda_healthy
from cutegen.evaluate.sol import sol_bound_ms
from cutegen.evaluate.worker import WorkerDied, WorkerPool
from cutegen.records import Peaks, Task, TaskTrace, to_json
from cutegen.survey.probe import probe_task
from cutegen.trace import trace_task


def precompile_job(task: Task, config: EvalConfig) -> dict[str, Any]:
    """The baseline worker's `reference` payload cut down to one trial, so one input set (the `compile`
    command then makes the one call that compiles): the same model, inputs, track flags and grad mode,
    so the graph inductor compiles, and its cache key, are the ones the measurement will ask for."""
    return reference_job(task, config, trials=1, adversarial=0, weight_seeds=1, probe=False, exact=False,
                         reusable=True)


def precompile_one(held: BaselineWorker, task: Task, config: EvalConfig, deadline: float) -> dict[str, Any]:
    """Compile one (task, track) in `held`'s worker, which it releases."""
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
    def need(cls, trace: TaskTrace | str | None) -> int | None:
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
    """`jobs` lanes, each a worker kept from chunk to chunk that takes the next (task, track) of the
    chunk when it has compiled one. Every worker compiles with one thread (the caller sets
    TORCHINDUCTOR_COMPILE_THREADS=1): with a lane per CPU, inductor's own compile worker processes
    would only add their start-up to every compile."""

    def __init__(self, configs: dict[str, EvalConfig], jobs: int, inductor_dir: Path) -> None:
        first = next(iter(configs.values()))
        self.configs, self.jobs, self.inductor_dir = configs, max(1, jobs), inductor_dir
        slots = {"gpus": tuple(first.gpus[:1]) * self.jobs} if first.device == "cuda" else {"cpu_slots": self.jobs}
        self.gate = MemoryGate(int(0.6 * available_memory_bytes()))
        self.pool = WorkerPool(first.device, warm_spares=False, warm_profiler=False, warm_compile=True, **slots)
        self.lanes = [BaselineWorker(self.pool) for _ in range(self.jobs)]

    def run(self, units: list[tuple[Task, str]], deadline: float,
            traces: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        """Compile every (task, track) of a chunk once."""
        queue, lock = list(units), threading.Lock()
        results: dict[tuple[str, str], dict[str, Any]] = {}

        def lane(held: BaselineWorker) -> None:
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
        for path in self.inductor_dir.rglob("*.best_config"):
            path.unlink(missing_ok=True)
        return results

    def __enter__(self) -> "Precompiler":
        return self

    def __exit__(self, *exc: Any) -> None:
        for held in self.lanes:
            held.drop()
        self.pool.close()


def fx_graph_entries(inductor_dir: Path) -> int:
    folder = inductor_dir / "fxgraph"
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def measure(task: Task, track: str, config: EvalConfig, pool: WorkerPool, held: BaselineWorker,
            peaks: Peaks | None, trace: TaskTrace | str, precision: str | None, inductor_dir: Path) -> dict[str, Any]:
    """One (task, track): the baselines through the evaluator's path, then the speed-of-light fields."""
    before, started = fx_graph_entries(inductor_dir), time.perf_counter()
    try:
        baselines = get_baselines(task, config, pool, held)
    except TaskError as err:  # the reference fails: a fact about the task, recorded; the run goes on
        return {"error": err.problem[:2000], "seconds": round(time.perf_counter() - started, 2)}
    row = {k: v for k, v in to_json(baselines).items() if k not in ("task_id", "task_sha256", "track")}
    row["seconds"] = round(time.perf_counter() - started, 2)
    row["fx_graph_entries_added"] = fx_graph_entries(inductor_dir) - before if config.compile_baseline else None
    eager, compiled = baselines.eager, baselines.compiled
    row["compile_speedup"] = eager.median_ms / compiled.median_ms if eager and compiled else None
    row.update(sol_fields(trace, peaks, track, precision, eager, compiled))
    return row


def sol_fields(trace: TaskTrace | str, peaks: Peaks | None, track: str, precision: str | None, eager: Any,
               compiled: Any) -> dict[str, Any]:
    """The bound as the evaluator computes it for a candidate: the half-precision peak when the task's
    lowest-precision tensor is bf16/fp16 (known from the probe's reference run), else the track's fp32
    rule."""
    if peaks is None:
        return {"sol_bound_ms": None, "sol_error": "no peaks: the speed of light is measured on a CUDA device only"}
    if isinstance(trace, str) or trace.error:
        return {"sol_bound_ms": None, "sol_error": f"trace failed: {trace if isinstance(trace, str) else trace.error}"}
    bound = sol_bound_ms(trace, peaks, track, precision in HALF_DTYPES)
    return {"sol_bound_ms": bound, "sol_precision": precision or "float32 (assumed: no probe)",
            "sol_fraction_eager": bound / eager.median_ms if bound and eager and eager.median_ms > 0 else None,
            "sol_fraction_compiled": bound / compiled.median_ms if bound and compiled and compiled.median_ms > 0
            else None}


def trace_of(task: Task) -> TaskTrace | str:
    """The task's meta-tensor trace, or the reason it could not be made (a task that cannot load)."""
    try:
        return trace_task(task)
    except TaskError as err:
        return err.problem[:300]


def trace_fields(trace: TaskTrace | str) -> dict[str, Any]:
    if isinstance(trace, str):
        return {"error": trace}
    return {"flops": trace.flops, "min_bytes": trace.min_bytes, "workload_class": trace.workload_class,
            "anchor_op": trace.anchor_op, "error": trace.error}


def probe(task: Task, device: str, now_utc: str) -> dict[str, Any]:
    """`probe.probe_task` for one task; a failure is recorded as the task's."""
    try:
        row = probe_task(task, device)
    except Exception as err:  # noqa: BLE001 - one broken task must not end the run
        row = {"error": f"{type(err).__name__}: {err}"[:400], "trace": traceback.format_exc()[-800:]}
    if device == "cuda":  # the measuring worker, not this process, needs the device's memory next
        import torch  # lazy: loading torch takes seconds

        torch.cuda.empty_cache()
    row.pop("task_id", None)
    row.pop("name", None)
    return {**row, "measured_utc": now_utc}


def probe_is_broken(device: str) -> bool:
    """After a probe error on the GPU: True when this process's CUDA context is broken (a sticky
    error), so that no later task's probe records that error as its own."""
    return device == "cuda" and not cuda_healthy()
