"""Timing: one protocol, used for candidates and baselines alike (runs inside a worker)."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from cutegen.records import TimingStats

MIN_FLUSH_BYTES = 128 << 20
CPU_FLUSH_BYTES = 64 << 20  # larger than the last-level cache of the CPUs CI runs on


@dataclass
class TimedRun:
    """Raw result of `time_forward`: per-trial times and the outputs kept for validation."""

    times_ms: list[float]
    kept: dict[int, tuple[int, Any]] = field(default_factory=dict)  # trial -> (input set, outputs)


def flush_bytes(device: Any) -> int:
    """Bytes written before each trial: twice the L2 (at least 128 MiB) on a GPU."""
    import torch

    if device.type != "cuda":
        return CPU_FLUSH_BYTES
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return max(2 * l2, MIN_FLUSH_BYTES)


def random_trials(trials: int, count: int) -> tuple[int, ...]:
    """`count` distinct trial indices drawn from os.urandom (no seed the candidate could predict)."""
    import random

    rng = random.Random(os.urandom(16))
    return tuple(sorted(rng.sample(range(trials), min(count, trials))))


def time_forward(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], *, device: Any,
                 trials: int, warmup: int, keep: Sequence[int] = ()) -> TimedRun:
    """Time `fn` by the one timing protocol (EVALUATION.md, "Timing").

    - Everything runs under `torch.no_grad()`, in the calling process, with the precision track's
      flags already set by the caller (so candidate, eager and torch.compile see the same settings).
    - `warmup` untimed calls first (this is also where torch.compile compiles and where lazy kernel
      loading happens), cycling over the input sets.
    - Then `trials` timed calls. Before each, a buffer larger than the L2 cache (twice its size, at
      least 128 MiB; 64 MiB on a CPU) is written, so no call finds its inputs or weights in cache.
    - Input sets are cycled (trial i uses set i mod len): a candidate cannot return the result of
      the previous call, and each set's reference output is known to the caller.
    - On CUDA: a start event is recorded on the current stream, `fn` is called, then
      `torch.cuda.synchronize()` waits for the whole device (work on other streams counts) before
      the end event is recorded; the time is the elapsed time between the events. On a CPU the same
      structure is timed with `time.perf_counter`.
    - The outputs of the trials listed in `keep` (chosen at random by the caller, after the
      candidate was imported) are cloned after their end event and returned, to be compared with the
      reference for that input set: a candidate that computes only on some calls, or caches results
      across calls, fails there.
    - The caller summarises the times with `summarize` (median, mean, min, IQR).
    """
    import time

    import torch

    cuda = device.type == "cuda"
    keep_set = set(keep)
    run = TimedRun(times_ms=[])
    with torch.no_grad():
        flush = torch.empty(flush_bytes(device) // 4, dtype=torch.int32, device=device)
        for i in range(warmup):
            fn(*input_sets[i % len(input_sets)])
        if cuda:
            torch.cuda.synchronize()
        for i in range(trials):
            which = i % len(input_sets)
            flush.fill_(i)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(*input_sets[which])
                torch.cuda.synchronize()
                end.record()
                end.synchronize()
                run.times_ms.append(start.elapsed_time(end))
            else:
                began = time.perf_counter()
                out = fn(*input_sets[which])
                run.times_ms.append((time.perf_counter() - began) * 1e3)
            if i in keep_set:
                run.kept[i] = (which, clone_outputs(out))
            del out
        del flush
    return run


def clone_outputs(out: Any) -> Any:
    """A detached copy of a tensor or a (nested) tuple/list of them; other values as they are."""
    import torch

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
