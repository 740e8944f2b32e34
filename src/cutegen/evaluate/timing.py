"""Timing: one protocol, used for candidates and baselines alike (runs inside a worker)."""

from __future__ import annotations

import ctypes
import functools
import os
import random
import statistics
import time
from time import perf_counter as _perf_counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from cutegen.records import TimingStats

MIN_FLUSH_BYTES = 128 << 20
CPU_FLUSH_BYTES = 64 << 20  # larger than the last-level cache of the CPUs CI runs on


@dataclass
class TimedRun:
    """Raw result of `time_forward`: per-trial times.

    `stream_ms`/`idle_ms` are, per trial, the time to the end event on the caller's stream and to the
    device being idle; `past_stream` counts the trials whose device work outlasted the stream by more
    than `idle_limit_ms` (then `times_ms` holds the time to idle)."""

    times_ms: list[float]
    stream_ms: list[float] = field(default_factory=list)
    idle_ms: list[float] = field(default_factory=list)
    past_stream: int = 0
    idle_limit_ms: float | None = None


def flush_bytes(device: Any) -> int:
    """Bytes read before each trial: twice the L2 (at least 128 MiB) on a GPU."""
    import torch  # lazy: loading torch takes seconds

    if device.type != "cuda":
        return CPU_FLUSH_BYTES
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return max(2 * l2, MIN_FLUSH_BYTES)


def random_trials(trials: int, count: int) -> tuple[int, ...]:
    """`count` distinct trial indices drawn from os.urandom (no seed the candidate could predict)."""

    rng = random.Random(os.urandom(16))
    return tuple(sorted(rng.sample(range(trials), min(count, trials))))


def _sync_gap_limit_ms(samples: int = 10, wait_ms: float = 0.0) -> float:
    """How long a device-wide synchronize plus an event record take after a wait as long as the
    timed call (a sleep kernel of `wait_ms` on the current stream), with margin.

    A trial whose wait for the whole device takes longer than this after its end event had work
    running past the end of the caller's stream (another stream) or an unusually slow host wake-up;
    either way its time is then taken to the idle device, the conservative reading. The host wakes
    up later from a long wait than from none: calibrated on a call that launches nothing, the limit
    was exceeded by honest multi-millisecond calls on one stream (an H200's full evaluations timed
    up to 99 of 100 of them to the idle device, 30-90 us above Nsight Compute's kernel time), so
    the calibration waits as long as the call does.
    """
    sleep = _sleeper(wait_ms)
    gaps = []
    for _ in range(samples):
        _, on_stream, to_idle = _timed_cuda_call(sleep, ())
        gaps.append(to_idle - on_stream)
    # From the median, not the maximum: one slow host wake-up must not widen the window in which work
    # on another stream goes uncounted; a normal trial that exceeds it is only timed conservatively.
    return 3.0 * statistics.median(gaps) + 0.005


CALIBRATION_MAX_MS = 50.0  # longer calls are calibrated with a 50 ms wait (the wake-up does not grow further)


def _sleeper(wait_ms: float) -> Callable[[], Any]:
    """A call that keeps the current stream busy for about `wait_ms` (nothing below 10 us)."""
    import torch  # lazy: loading torch takes seconds

    if wait_ms < 0.01:
        return lambda: None
    cycles = int(min(wait_ms, CALIBRATION_MAX_MS) * _cycles_per_ms())
    return lambda: torch.cuda._sleep(cycles)


@functools.lru_cache(maxsize=1)
def _cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of `torch.cuda._sleep`, measured once per process."""
    import torch  # lazy: loading torch takes seconds

    torch.cuda._sleep(1000)  # loads the sleep kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    return 2_000_000 / max(start.elapsed_time(end), 1e-3)


# Time past the stream counts as hidden work only when it is also this share of the call's time to
# the idle device. The host's wake-up from a long synchronize alone outlasts the idle-device gap: on
# the H200 an honest 10.9 ms call on one stream ran past a 0.07 ms limit in 8 of 8 trials. It is a
# small part of such a call, while work moved off the caller's stream leaves that stream early.
HIDDEN_SHARE = 0.25


def ran_past_stream(on_stream_ms: float, to_idle_ms: float, limit_ms: float, share: float = 0.0) -> bool:
    """Whether a trial kept the device busy after the caller's stream had finished for longer than
    `limit_ms` and than `share` of its time to the idle device. The one rule behind `time_forward`'s
    choice of time (share 0) and `hidden_work_trials`."""
    return to_idle_ms - on_stream_ms > max(limit_ms, share * to_idle_ms)


def hidden_work_trials(stream_ms: Sequence[float], idle_ms: Sequence[float], limit_ms: float | None,
                       share: float = HIDDEN_SHARE) -> int:
    """Trials in which the device stayed busy after the caller's stream had finished for longer than
    `limit_ms` and for more than `share` of the call: work launched on another stream. Every trial
    past `limit_ms` is already timed to the idle device (`time_forward`; `share=0` counts those);
    this count is what the verdict judges, so that a long honest call is not taken for one that hides
    work."""
    if limit_ms is None:
        return 0
    return sum(ran_past_stream(on_stream, to_idle, limit_ms, share) for on_stream, to_idle in zip(stream_ms, idle_ms))


def _timed_cuda_call(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, float, float]:
    """(outputs, ms to the end event on the current stream, ms to the idle device) of one call."""
    import torch  # lazy: loading torch takes seconds

    start, end, idle = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    out = fn(*args)
    end.record()
    torch.cuda.synchronize()  # the whole device: work on other streams is waited for too
    idle.record()
    idle.synchronize()
    return out, start.elapsed_time(end), start.elapsed_time(idle)


def time_forward(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], *, device: Any,
                 trials: int, warmup: int) -> TimedRun:
    """Time `fn` by the baselines' timing protocol (EVALUATION.md, "Timing"); a candidate's timed calls
    follow `time_batch`, which shares its per-call measurement (`_timed_cuda_call`) and flush.

    - Everything runs under `torch.no_grad()`, in the calling process, with the precision track's
      flags already set by the caller (so candidate, eager and torch.compile see the same settings).
    - `warmup` untimed calls first (this is also where torch.compile compiles and where lazy kernel
      loading happens), cycling over the input sets; on CUDA each is followed by a synchronize, and
      the median of their stream times sets how long the calibration of the device-wide wait waits.
    - Then `trials` timed calls. Before each, a buffer larger than the L2 cache (twice its size, at
      least 128 MiB) is read on the device, so no call finds its inputs or weights in cache. It is
      read, not written: a written buffer leaves the L2 full of dirty lines whose write-back would
      then be charged to the timed call (Nsight Compute's cache control invalidates instead). The
      flush is queued, not waited for, so the host-side cost of starting `fn` overlaps it, as it
      overlaps the previous op's GPU work in a real model. On a CPU a 64 MiB buffer is written.
    - Input sets are cycled (trial i uses set i mod len): a candidate cannot return the result of
      the previous call, and each set's reference output is known to the caller.
    - On CUDA: a start event is recorded on the current stream, `fn` is called, an end event is
      recorded on the current stream, then `torch.cuda.synchronize()` waits for the whole device
      and an idle event is recorded. The trial's time is start -> end, unless the wait for the whole
      device took longer than it does after a sleep kernel as long as the call (`_sync_gap_limit_ms`,
      measured first): then work outlasted the stream (another stream) and the time is start -> idle. The synchronize's own
      latency (~10 us) is thus not charged to the call, while work on other streams still counts;
      `past_stream` says how many trials ran past their stream, and `hidden_work_trials` which of
      those hid work on another stream. On a CPU the call is timed with `time.perf_counter`.
    - The caller summarises the times with `summarize` (median, mean, min, IQR).
    """

    import torch  # lazy: loading torch takes seconds

    cuda = device.type == "cuda"
    run = TimedRun(times_ms=[])
    with torch.no_grad():
        flush = torch.zeros(flush_bytes(device) // 4, dtype=torch.int32, device=device)
        warm_ms = []
        for i in range(warmup):
            if cuda:
                warm_ms.append(_timed_cuda_call(fn, input_sets[i % len(input_sets)])[1])
            else:
                fn(*input_sets[i % len(input_sets)])
        if cuda:
            torch.cuda.synchronize()
            run.idle_limit_ms = _sync_gap_limit_ms(wait_ms=statistics.median(warm_ms) if warm_ms else 0.0)
        for i in range(trials):
            which = i % len(input_sets)
            if cuda:
                flush.max()  # a read of 2x the L2 (see above); the scalar result is not needed
                out, on_stream, to_idle = _timed_cuda_call(fn, input_sets[which])
                past = ran_past_stream(on_stream, to_idle, run.idle_limit_ms)
                run.past_stream += past
                run.stream_ms.append(on_stream)
                run.idle_ms.append(to_idle)
                run.times_ms.append(to_idle if past else on_stream)
            else:
                flush.fill_(i)
                began = time.perf_counter()
                out = fn(*input_sets[which])
                run.times_ms.append((time.perf_counter() - began) * 1e3)
            del out
        del flush
    return run


# ------------------------------------------------------------- timed batches (the candidate's timing)


@dataclass
class BatchRun:
    """Raw result of `time_batch`: one entry per call; `retained[i]` is a copy of call i's outputs,
    made after the device was idle, kept until the parent has chosen which calls to verify."""

    times_ms: list[float] = field(default_factory=list)
    stream_ms: list[float] = field(default_factory=list)
    idle_ms: list[float] = field(default_factory=list)
    retained: list[Any] = field(default_factory=list)


_CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06  # cudaLimitPersistingL2CacheSize


@functools.lru_cache(maxsize=1)
def _cudart() -> Any:
    """The CUDA runtime library torch loaded (None where it cannot be found: then persisting-L2 state
    is left alone, and the flush alone clears the cache)."""

    import torch  # lazy: loading torch takes seconds

    for name in (f"libcudart.so.{torch.version.cuda.split('.')[0]}" if torch.version.cuda else "", "libcudart.so"):
        try:
            return ctypes.CDLL(name) if name else None
        except OSError:
            continue
    return None


def reset_persisting_l2() -> None:
    """Turn every persisting L2 line back into a normal one and set the persisting carve-out to 0.

    Defeats a kernel that marks its inputs or weights persisting (an access-policy window on the
    stream, or the device limit), so that they survive the L2 flush between timed calls and every call
    after the first finds them in cache. Called before each timed call, ahead of the flush."""
    lib = _cudart()
    if lib is not None:
        lib.cudaDeviceSetLimit(_CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)
        lib.cudaCtxResetPersistingL2Cache()


# The driver scrubs device memory given back to it (cudaFree, torch.cuda.empty_cache) in the background,
# on no stream that a synchronize waits for, and the scrub takes a share of the memory bandwidth. On the
# H200 a 1 GiB read ran 13% slower for 0.27 s after churn_free_memory gave back 138 GiB, and for about
# 0.035 s after an empty_cache of 16 GiB (bench/results/scrub-h200/): 500-550 GB/s. Timed right after
# the churn, the sum over dim 1 of level1/47's 8.6 GB input took 2.41 ms instead of 2.12, and a
# candidate's 2.55 ms instead of 2.16, while the baselines are timed with no churn before them: such
# candidates were judged up to 18% slower than they are. The wait assumes a slower scrub than measured
# and never waits longer than a scrub of all of an H200's memory took.
SCRUB_BYTES_PER_S = 400e9
SCRUB_WAIT_CAP_S = 0.5


def give_back_cached() -> int:
    """torch.cuda.empty_cache() on the current device: the bytes its allocator gave back to the driver,
    which the driver then scrubs (wait_for_scrub)."""
    import torch  # lazy: loading torch takes seconds

    held = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, held - torch.cuda.memory_reserved())


def scrub_wait_s(freed_bytes: int, elapsed_s: float) -> float:
    """Seconds still to wait, `elapsed_s` after `freed_bytes` went back to the driver, before its scrub
    is over (SCRUB_BYTES_PER_S, at most SCRUB_WAIT_CAP_S in all)."""
    if freed_bytes <= 0:
        return 0.0
    return max(0.0, min(SCRUB_WAIT_CAP_S, freed_bytes / SCRUB_BYTES_PER_S) - max(0.0, elapsed_s))


def wait_for_scrub(freed_bytes: int, elapsed_s: float) -> float:
    """Sleep out the driver's scrub of `freed_bytes` given back `elapsed_s` ago (scrub_wait_s), so that
    no timed call shares the memory bandwidth with it; the seconds slept."""
    wait = scrub_wait_s(freed_bytes, elapsed_s)
    if wait > 0:
        time.sleep(wait)
    return wait


def time_batch(fn: Callable[..., Any], draw: Callable[[int], Sequence[Any]], *, device: Any, calls: int,
               idle_limit_ms: float | None) -> BatchRun:
    """One timed batch of the candidate's timing protocol (EVALUATION.md, "Timing").

    Each call i gets inputs of its own, `draw(i)`, made right before it from a seed the parent drew
    for that call alone (no correctness trial and no other call saw them, so a result memoised by
    input content is never reused). Before each call the persisting L2 state is reset
    (`reset_persisting_l2`) and a buffer of twice the L2 is read (`flush_bytes`); the call is timed by
    the same events as `time_forward` (start -> end on the current stream, or to the idle device
    when work outlasted the stream by more than `idle_limit_ms`). After the device is idle, a copy
    of every call's outputs is retained: the parent chooses which calls to verify only after this
    batch has returned, so every call must be right. The parent also times the whole command on its
    own clock (clock.py), which every piece of work in this loop, the candidate's included, falls
    under. On a CPU the call is timed with `time.perf_counter`.
    """
    import torch  # lazy: loading torch takes seconds

    cuda = device.type == "cuda"
    run = BatchRun()
    with torch.no_grad():
        flush = torch.zeros(flush_bytes(device) // 4, dtype=torch.int32, device=device)
        for i in range(calls):
            inputs = draw(i)
            if cuda:
                reset_persisting_l2()
                flush.max()  # a read of 2x the L2 (see time_forward)
                out, on_stream, to_idle = _timed_cuda_call(fn, inputs)
                past = idle_limit_ms is not None and ran_past_stream(on_stream, to_idle, idle_limit_ms)
                run.stream_ms.append(on_stream)
                run.idle_ms.append(to_idle)
                run.times_ms.append(to_idle if past else on_stream)
            else:
                flush.fill_(i)
                began = _perf_counter()
                out = fn(*inputs)
                run.times_ms.append((_perf_counter() - began) * 1e3)
            run.retained.append(clone_outputs(out))
            del out, inputs
        del flush
    return run


def warm_up(fn: Callable[..., Any], draw: Callable[[int], Sequence[Any]], *, device: Any, calls: int) -> float | None:
    """`calls` untimed calls on inputs of their own (compiles, lazy loading, allocator growth), then,
    on CUDA, the limit past which a call's wait for the whole device counts as work on another stream
    (`_sync_gap_limit_ms`, calibrated on a wait as long as the median call)."""
    import torch  # lazy: loading torch takes seconds

    warm_ms = []
    with torch.no_grad():
        for i in range(calls):
            inputs = draw(i)
            if device.type == "cuda":
                warm_ms.append(_timed_cuda_call(fn, inputs)[1])
            else:
                fn(*inputs)
            del inputs
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    return _sync_gap_limit_ms(wait_ms=statistics.median(warm_ms) if warm_ms else 0.0)


# ------------------------------------------------------------------ the baselines (in a worker)


def time_baseline(fn: Any, sets: list[Any], device: Any, spec: dict[str, Any]) -> list[float]:
    """In a worker: raw times of `fn` (the reference, eager or compiled) by the one protocol."""
    return time_forward(fn, sets, device=device, trials=spec["trials"], warmup=spec["warmup"]).times_ms


def compile_reference(model: Any, sets: list[Any]) -> tuple[Any, str | None]:
    """In a worker: torch.compile(model) and its first call, which compiles (or loads the cache);
    (the compiled model, None), or (None, why it failed)."""
    import torch  # lazy: loading torch takes seconds

    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*sets[0])
    except Exception as err:  # noqa: BLE001 - an unsupported op is a fact about the task, not a bug
        return None, f"{type(err).__name__}: {err}"[:2000]
    finally:
        _stop_compile_workers()
    return compiled, None


def _stop_compile_workers() -> None:
    """End inductor's compile worker processes before the compiled model is timed. torch.compile
    starts them in the background even when every graph comes from the cache (up to one per CPU,
    each importing torch), and they would compete for the host with the timed calls, whose launch
    cost is part of the time. A later recompile starts a new pool."""
    from torch._inductor import async_compile  # lazy: loading torch takes seconds

    stop = getattr(async_compile, "shutdown_compile_workers", None)
    if stop is not None:
        stop()


def clone_outputs(out: Any) -> Any:
    """A detached copy of a tensor or a (nested) tuple/list of them; other values as they are."""
    import torch  # lazy: loading torch takes seconds

    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    if isinstance(out, (tuple, list)):
        return type(out)(clone_outputs(o) for o in out)
    return out


def summarize(times_ms: Sequence[float]) -> TimingStats:
    """Median, mean, min and interquartile range of per-trial times (milliseconds)."""
    if not times_ms:
        raise ValueError("no timed trials to summarise")
    ordered = sorted(float(t) for t in times_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return TimingStats(
        median_ms=statistics.median(ordered),
        mean_ms=statistics.fmean(ordered),
        min_ms=ordered[0],
        iqr_ms=q3 - q1,
        trials=len(ordered),
    )
