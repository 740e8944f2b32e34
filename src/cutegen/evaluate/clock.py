"""The parent's clock: each timed batch measured by the trusted process as well as by the worker.

Defeats every way of making the reported GPU times smaller than the work behind them from inside the
candidate's process: a timing record halved through the heap, the evaluator's timing function
wrapped at import, CUDA event timing patched, work moved out of the timed region into the judge's own
steps (the output copies, the input draws), or a reply forged over the worker's channel. None of
these can shorten the parent's wall time around the batch, which covers every call of it.

The parent times three things around the worker's commands (EVALUATION.md, "Two clocks"):

- calibration batches, run before the candidate is imported (so the worker is still the judge's own):
  the timing loop around a forward that only allocates the outputs. Wall time minus reported time,
  per call, is the loop's own cost (drawing each call's inputs, the L2 flush, copying the outputs,
  the synchronisations, the round trip); the smallest over the batches is kept (the machine's other
  work can only add to it);
- each timed batch of the candidate: its wall time minus the calibrated cost of its calls is the time
  the candidate's calls can have taken; the reported GPU times must account for it;
- the export of the outputs chosen for verification, against the calibrated export: a worker that
  computes the chosen outputs only when asked for them pays that time here (a late export makes its
  batch's calls count at least at that time; no export on time fails the check).

A batch's unexplained time is `wall - calls * overhead - reported`. Honest batches leave a little
(host jitter, a garbage collection, the host waking up later from a longer wait). A batch *agrees*
when it leaves no more than `unexplained_limit_ms` (a share of the reported time plus a margin per
call). An agreeing batch's times count as reported; a disagreeing one's are scaled up to the parent's
time for it (`counted_times`), so a batch disturbed by the machine (a CPU shared with other work
delays the worker between calls) only counts as slower, and a candidate that forges some batches, or
slows some on purpose to be rid of them, gains nothing. When fewer than half the batches agree,
`RETRY_BATCHES` more are measured; the check fails when none of them all agrees.
The verdict reports the ratio of the parent's time to the time accounted for (the reported times plus
the calibrated loop cost) over every batch: near 1 for honest kernels.

The clock sees each batch's sum, not how the record splits it between calls: a record with the right
sum and half its calls near zero would halve the median. No call counts as faster than a share of
its batches' mean call (`mean_floor_ms`), so such a record gains at most 1 / MEAN_FLOOR_SHARE.

What this cannot see: a forgery smaller than the margin (for calls of a few microseconds, the margin
is larger than the call), a record reshaped within the floor's share, and work done before the batch
command arrived (which cannot depend on the inputs, drawn inside the batch).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

from cutegen.records import CheckResult

SHARE_OF_REPORTED = 0.5  # unexplained time allowed as a share of the reported time (a halved record has 1.0)
MARGIN_PER_CALL_MS = 0.05  # and per call, for host jitter (a Python call, a wake-up)
OVERHEAD_SHARE = 1.0  # and the calibrated overhead per call once more (the machine's load moves it)
RETRY_BATCHES = 3  # a failing clock is measured again on this many more batches before it counts
MEAN_FLOOR_SHARE = 0.9  # no call counts as faster than this share of the median batch's mean call
EXPORT_SLACK_MS = 20.0  # an export may take this much longer than the calibrated one, plus...
EXPORT_CALL_SHARE = 0.5  # ...this share of a median call per exported output


SWITCH_INTERVAL_S = 1e-4  # the parent's thread switch interval while it times a batch


@contextlib.contextmanager
def prompt_wakeups() -> Iterator[None]:
    """While the parent times a batch: other threads of the parent (a run judges several candidates
    at once) hand the interpreter lock over within 0.1 ms instead of Python's 5 ms, so the thread that
    reads the worker's reply wakes up when it arrives; otherwise that wait shows as unexplained time
    (seen on the H200: 0.3-0.6 ms a call for honest kernels judged side by side)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@dataclass(frozen=True)
class BatchClock:
    """One batch as both sides saw it."""

    calls: int
    wall_ms: float  # the parent's clock, from sending the command to reading the reply
    reported_ms: float  # the sum of the per-call times the worker reported


def overhead_per_call_ms(calibration: Sequence[BatchClock]) -> float:
    """The timing loop's own cost per call, from batches timed before the candidate's import."""
    if not calibration:
        raise ValueError("no calibration batch")
    return min(max(0.0, b.wall_ms - b.reported_ms) / b.calls for b in calibration)


def unexplained_ms(batch: BatchClock, overhead_ms: float) -> float:
    return batch.wall_ms - batch.calls * overhead_ms - batch.reported_ms


def unexplained_limit_ms(batch: BatchClock, overhead_ms: float) -> float:
    return (SHARE_OF_REPORTED * batch.reported_ms
            + batch.calls * (MARGIN_PER_CALL_MS + OVERHEAD_SHARE * overhead_ms))


def clock_ratio(batches: Sequence[BatchClock], overhead_ms: float) -> float | None:
    """The parent's time over the time accounted for: the reported times plus the calibrated loop cost
    of each call (1.0: they agree; 2 for a long kernel whose record was halved). Not the parent's time
    less the loop cost over the reported time: for calls of a few microseconds that difference is
    smaller than the loop cost's jitter, and came out negative or tenfold on the H200 for honest
    kernels; this one stays near 1 for honest kernels of any length (and short calls are judged
    within the margin anyway, see above)."""
    accounted = sum(b.reported_ms + b.calls * overhead_ms for b in batches)
    if accounted <= 0:
        return None
    return sum(b.wall_ms for b in batches) / accounted


def agrees(batch: BatchClock, overhead_ms: float) -> bool:
    """Whether the batch's reported times account for the parent's time (within the limit)."""
    return unexplained_ms(batch, overhead_ms) <= unexplained_limit_ms(batch, overhead_ms)


def agreeing_share(batches: Sequence[BatchClock], overhead_ms: float) -> float:
    return sum(agrees(b, overhead_ms) for b in batches) / len(batches) if batches else 1.0


def export_allowed_ms(export_calibrated_ms: float, median_call_ms: float) -> float:
    """How long exporting one batch's chosen outputs may take on the parent's clock."""
    return export_calibrated_ms * 3 + EXPORT_SLACK_MS + EXPORT_CALL_SHARE * median_call_ms


def mean_floor_ms(batches: Sequence[BatchClock], times_ms: Sequence[float]) -> float:
    """The fastest a call may count: MEAN_FLOOR_SHARE of the median over batches of each batch's mean
    call. The parent's clock verifies each batch's sum, never how the worker split it between calls,
    so a forged record with the right sum can make half the calls near zero and the median with them;
    each batch's mean is what the clock vouches for. The median over batches keeps one disturbed
    batch from raising the floor; an honest batch's calls spread little about its mean (a few slow
    ones raise the mean by percents), so the floor stays under their median. What remains: a record
    reshaped within the share gains at most 1 / MEAN_FLOOR_SHARE."""
    means, start = [], 0
    for batch in batches:
        part = times_ms[start:start + batch.calls]
        if part:
            means.append(sum(part) / len(part))
        start += batch.calls
    return MEAN_FLOOR_SHARE * statistics.median(means) if means else 0.0


def counted_times(batches: Sequence[BatchClock], times_ms: Sequence[float], overhead_ms: float,
                  late_exports_ms: Sequence[float] = (), floor: bool = False) -> list[float]:
    """The per-call times the verdict counts (`times_ms` holds every batch's calls, in order): an
    agreeing batch's as reported; a disagreeing batch's scaled up to the parent's time for it
    (`wall - calls * overhead` over the reported sum), so that a batch made to disagree, by forging
    its record or by slowing it on purpose, can only count as slower, never be left out. A batch
    whose export came late (`late_exports_ms`: per batch, the time its export took beyond the
    calibrated one, 0 when on time) counts each call at least at that time: outputs computed only
    when asked for cost at least that much each. With `floor`, no call counts as faster than
    `mean_floor_ms` of the times so counted (a record reshaped within its batches gains nothing)."""
    counted, start = [], 0
    for index, batch in enumerate(batches):
        part = list(times_ms[start:start + batch.calls])
        if not agrees(batch, overhead_ms) and batch.reported_ms > 0:
            factor = max(1.0, (batch.wall_ms - batch.calls * overhead_ms) / batch.reported_ms)
            part = [t * factor for t in part]
        late = late_exports_ms[index] if index < len(late_exports_ms) else 0.0
        if late > 0:
            part = [max(t, late) for t in part]
        counted += part
        start += batch.calls
    if floor:
        lowest = mean_floor_ms(batches, counted)
        counted = [max(t, lowest) for t in counted]
    return counted


def late_exports_ms(export_ms: Sequence[float], export_calibrated_ms: float, median_call_ms: float) -> list[float]:
    """Per batch: what its export took beyond the calibrated one when over its allowance, else 0."""
    allowed = export_allowed_ms(export_calibrated_ms, median_call_ms)
    return [took - export_calibrated_ms if took > allowed else 0.0 for took in export_ms]


def judge_parent_clock(batches: Sequence[BatchClock], overhead_ms: float, export_ms: Sequence[float] = (),
                       export_calibrated_ms: float | None = None, median_call_ms: float = 0.0) -> CheckResult:
    """The `parent_clock` check: at least one batch whose reported times account for the parent's
    time (the others count at the parent's time, `counted_times`), and the exports of chosen outputs no slower
    than calibrated beyond what recomputing them would cost."""
    ratio = clock_ratio(batches, overhead_ms)
    shown = f"{ratio:.3f}" if ratio is not None else "n/a"
    agreeing = [b for b in batches if agrees(b, overhead_ms)]
    if batches and not agreeing:
        best = min(batches, key=lambda b: unexplained_ms(b, overhead_ms) - unexplained_limit_ms(b, overhead_ms))
        return CheckResult(
            "parent_clock", "timing", False,
            f"no timed batch agrees with the parent's clock: in the closest, it saw"
            f" {unexplained_ms(best, overhead_ms):.3f} ms of a batch of {best.calls} calls that the reported"
            f" times ({best.reported_ms:.3f} ms) do not account for (allowed"
            f" {unexplained_limit_ms(best, overhead_ms):.3f} ms; overhead {overhead_ms:.4f} ms per call,"
            f" calibrated before the import); parent/reported ratio {shown}")
    if export_calibrated_ms is not None and export_ms:
        # One export on time is enough to pass (a loaded machine delays some); a late one makes its
        # batch's calls count at the time it took (`counted_times`).
        allowed = export_allowed_ms(export_calibrated_ms, median_call_ms)
        took = min(export_ms)
        if took > allowed:
            return CheckResult(
                "parent_clock", "timing", False,
                f"exporting the outputs chosen for verification took at least {took:.1f} ms on the parent's clock"
                f" in every batch (calibrated {export_calibrated_ms:.1f} ms, allowed {allowed:.1f} ms): the"
                " outputs were computed when they were asked for, not in the timed calls")
    return CheckResult("parent_clock", "timing", True,
                       f"parent/reported ratio {shown} over {len(batches)} batches, {len(agreeing)} agreeing"
                       f" (the others count at the parent's time; overhead {overhead_ms:.4f} ms per call)")
