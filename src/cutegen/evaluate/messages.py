"""Typed records of the worker's replies that the parent's clock judges, checked on arrival.

The timing replies come from the candidate's process, where native code can write anything: a reply
whose per-call times are missing, extra, negative, infinite or NaN would make the parent's arithmetic
meaningless (a NaN sorts anywhere and can pull a median down; a negative time lowers a batch's sum).
So the parent reads them into these records, and a reply that does not fit is the protocol broken
(`worker_protocol`), never a measurement. The other replies are raw measurements the parent compares
with its own (reference outputs, digests) and stay plain data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class ReplyMalformed(ValueError):
    """A reply that is not what the command returns: the verdict is `worker_protocol`."""


def _times(data: dict[str, Any], key: str, calls: int, *, optional: bool = False) -> tuple[float, ...]:
    values = data.get(key)
    if optional and not values:
        return ()
    if not isinstance(values, list) or len(values) != calls:
        count = len(values) if isinstance(values, list) else type(values).__name__
        raise ReplyMalformed(f"{key} holds {count} entries for a batch of {calls} calls")
    times = []
    for value in values:
        # bool is an int to Python, and no time; a string or a null is no time either
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ReplyMalformed(f"{key} holds {value!r}: every call's time must be a finite number of ms >= 0")
        times.append(float(value))
    return tuple(times)


@dataclass(frozen=True)
class TimedBatchReply:
    """A batch of timed calls as the worker reports it (runner.timed_batch, calibration_batch)."""

    times_ms: tuple[float, ...]  # each call's time, the end event's (or the device-wide wait's)
    stream_ms: tuple[float, ...]  # each call on the caller's stream alone (empty where not measured)
    idle_ms: tuple[float, ...]  # each call until the device was idle (empty where not measured)
    state_changes: tuple[Any, ...] = ()
    new_threads: tuple[Any, ...] = ()
    guard_refusals: tuple[Any, ...] = ()

    @property
    def reported_ms(self) -> float:
        return sum(self.times_ms)

    @classmethod
    def parse(cls, data: Any, calls: int) -> "TimedBatchReply":
        """The reply to a batch of `calls` calls; raises ReplyMalformed for anything else."""
        if not isinstance(data, dict):
            raise ReplyMalformed(f"a batch reply must be an object, not {type(data).__name__}")
        lists = {}
        for key in ("state_changes", "new_threads", "guard_refusals"):
            value = data.get(key) or []
            if not isinstance(value, list):
                raise ReplyMalformed(f"{key} must be a list, not {type(value).__name__}")
            lists[key] = tuple(value)
        return cls(_times(data, "times_ms", calls), _times(data, "stream_ms", calls, optional=True),
                   _times(data, "idle_ms", calls, optional=True), **lists)
