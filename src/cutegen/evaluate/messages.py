"""Typed records of the worker's replies that the parent judges, checked on arrival.

The timing replies come from the candidate's process, where native code can write anything: a reply
whose per-call times are missing, extra, negative, infinite or NaN would make the parent's arithmetic
meaningless (a NaN sorts anywhere and can pull a median down; a negative time lowers a batch's sum);
an export of timed outputs that names other calls than the parent chose would have the reference
compare outputs the parent did not pick; a trial's reply without its lists would end the evaluation
in an error instead of a verdict. So the parent reads them into these records (the build, the weights'
fingerprints, the calibration, the warm-up, each timed batch, each export of timed outputs, each
correctness trial, each ghost run, the determinism run, the op audit and the kernel audit), and a reply
that does not fit is the protocol broken (`worker_protocol`), never a measurement nor a crash of the
evaluation.

The determinism run and the two audits are computed in the candidate's process, so native code can
forge a passing record of them: they are evidence beside the checks the parent makes itself (the
reference process compares every trial's and the chosen timed calls' outputs), never the only check
of a property (EVALUATION.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from cutegen.evaluate.correctness import error_stats
from cutegen.records import ErrorStats


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


def _limit(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ReplyMalformed(f"{key} holds {value!r}: a time limit must be a finite number of ms >= 0")
    return float(value)


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ReplyMalformed(f"{what} must be an object, not {type(data).__name__}")
    return data


def _integrity(data: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """The integrity lists a reply after the candidate's import carries (runner._integrity)."""
    lists = {}
    for key in ("state_changes", "new_threads", "guard_refusals"):
        value = data.get(key)
        value = [] if value is None else value
        if not isinstance(value, list):
            raise ReplyMalformed(f"{key} must be a list, not {type(value).__name__}")
        lists[key] = tuple(value)
    return lists


@dataclass(frozen=True, kw_only=True)
class AfterImport:
    """What every reply after the candidate's import carries (runner._integrity): torch's global state
    changed since the import, threads left running, and the audit hook's refusals."""

    state_changes: tuple[Any, ...] = ()
    new_threads: tuple[Any, ...] = ()
    guard_refusals: tuple[Any, ...] = ()


@dataclass(frozen=True)
class CalibrationReply:
    """The answer to `calibrate` (runner.calibrate, before the candidate's import): the calls a batch
    holds, at most those asked for, and the device-wide wait's limit on the judge's own forward."""

    calls: int
    idle_limit_ms: float | None

    @classmethod
    def parse(cls, data: Any, wanted: int) -> "CalibrationReply":
        data = _object(data, "a calibration reply")
        calls = data.get("calls")
        if isinstance(calls, bool) or not isinstance(calls, int) or not 1 <= calls <= wanted:
            raise ReplyMalformed(f"calls holds {calls!r}: a batch holds 1 to {wanted} calls")
        return cls(calls, _limit(data, "idle_limit_ms"))


@dataclass(frozen=True)
class WarmupReply(AfterImport):
    """The answer to `timing_warmup` (runner.timing_warmup): the device-wide wait's limit, the seconds
    waited for the driver's scrub of freed memory (timing.wait_for_scrub), and the integrity lists
    after the candidate's warm-up calls."""

    idle_limit_ms: float | None
    scrub_wait_s: float = 0.0

    @classmethod
    def parse(cls, data: Any) -> "WarmupReply":
        data = _object(data, "a warm-up reply")
        return cls(_limit(data, "idle_limit_ms"), _seconds(data.get("scrub_wait_s", 0.0), "scrub_wait_s"),
                   **_integrity(data))


@dataclass(frozen=True)
class ExportReply:
    """The answer to `export_timed` (runner.export_timed): one output descriptor for each call the
    parent chose after the batch ran, and for no other."""

    outputs: dict[int, dict[str, Any]]

    @classmethod
    def parse(cls, data: Any, chosen: list[int]) -> "ExportReply":
        outputs = _object(data, "an export reply").get("outputs")
        if not isinstance(outputs, dict) or set(outputs) != {str(i) for i in chosen}:
            named = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
            raise ReplyMalformed(f"the export names the calls {named}, the parent chose {sorted(chosen)}")
        if not all(isinstance(descriptor, dict) for descriptor in outputs.values()):
            raise ReplyMalformed("each exported output must be described by an object")
        return cls({int(key): value for key, value in outputs.items()})


def _objects(data: dict[str, Any], key: str, fields: dict[str, type], problem: str) -> tuple[dict[str, Any], ...]:
    """`data[key]` as a tuple of objects, each holding `fields` of their types; ReplyMalformed(problem)
    for anything else."""
    values = data.get(key)
    if not isinstance(values, list) or not all(
            isinstance(v, dict) and all(isinstance(v.get(name), kind) for name, kind in fields.items()) for v in values):
        raise ReplyMalformed(problem)
    return tuple(values)


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key)
    if not isinstance(value, bool):
        raise ReplyMalformed(f"{key} must be true or false")
    return value


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ReplyMalformed(f"{what} holds {value!r}: a duration must be a finite number of seconds >= 0")
    return float(value)


@dataclass(frozen=True)
class BuildReply(AfterImport):
    """The answer to `build` (runner.build, the candidate's import): whether it defines ModelNew, the
    kernels its import built or found (name, cached, compile seconds) and how long it took."""

    model_new: bool
    kernels: tuple[dict[str, Any], ...]
    build_s: float

    @classmethod
    def parse(cls, data: Any) -> "BuildReply":
        data = _object(data, "a build reply")
        model_new = _flag(data, "model_new")
        kernels = _objects(data, "kernels", {"name": str, "cached": bool},
                           "kernels must be a list of objects, each with a name and whether it was cached")
        for kernel in kernels:
            if kernel.get("compile_s") is not None:
                _seconds(kernel["compile_s"], "a kernel's compile_s")
        return cls(model_new, kernels, _seconds(data.get("build_s"), "build_s"), **_integrity(data))


@dataclass(frozen=True)
class WeightsReply(AfterImport):
    """The answer to `weights` (runner.weights): for each weight seed, the fingerprint of each of
    ModelNew's parameters and buffers by name."""

    weights: tuple[dict[str, str], ...]

    @classmethod
    def parse(cls, data: Any, seeds: int) -> "WeightsReply":
        data = _object(data, "a weights reply")
        weights = data.get("weights")
        if not isinstance(weights, list) or len(weights) != seeds or not all(
                isinstance(w, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in w.items())
                for w in weights):
            raise ReplyMalformed(f"weights must hold {seeds} maps of parameter names to fingerprints")
        return cls(tuple(weights), **_integrity(data))


def _descriptor(data: dict[str, Any], key: str, *, optional: bool = False) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise ReplyMalformed(f"{key} must describe the exported outputs by an object, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class TrialReply(AfterImport):
    """The answer to `run_trial` (runner.run_trial): the exported outputs (None where their types were
    wrong), the input fingerprints when asked, the worker-side findings and mutated inputs."""

    outputs: dict[str, Any] | None
    fingerprints: tuple[str, ...] | None
    findings: tuple[dict[str, Any], ...]
    mutated: tuple[int, ...]

    @classmethod
    def parse(cls, data: Any) -> "TrialReply":
        data = _object(data, "a trial reply")
        prints = data.get("fingerprints")
        if prints is not None and (not isinstance(prints, list) or not all(isinstance(p, str) for p in prints)):
            raise ReplyMalformed("fingerprints must be a list of strings")
        findings = _objects(data, "findings", {"check": str, "message": str},
                            "findings must be a list of objects, each with a check and a message")
        mutated = data.get("mutated")
        if not isinstance(mutated, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in mutated):
            raise ReplyMalformed("mutated must be a list of input indices")
        return cls(_descriptor(data, "outputs", optional=True), None if prints is None else tuple(prints),
                   findings, tuple(mutated), **_integrity(data))


@dataclass(frozen=True)
class GhostRunReply(AfterImport):
    """The answer to `ghost_run` (runner.ghost_run): the exported outputs on trial 0's inputs and on the
    perturbed ones (an empty list of leaves where the perturbed output's shape changed)."""

    base: dict[str, Any]
    perturbed: dict[str, Any]

    @classmethod
    def parse(cls, data: Any) -> "GhostRunReply":
        data = _object(data, "a ghost run's reply")
        return cls(_descriptor(data, "base"), _descriptor(data, "perturbed"), **_integrity(data))


@dataclass(frozen=True)
class TimedBatchReply(AfterImport):
    """A batch of timed calls as the worker reports it (runner.timed_batch, calibration_batch)."""

    times_ms: tuple[float, ...]  # each call's time, the end event's (or the device-wide wait's)
    stream_ms: tuple[float, ...]  # each call on the caller's stream alone (empty where not measured)
    idle_ms: tuple[float, ...]  # each call until the device was idle (empty where not measured)

    @property
    def reported_ms(self) -> float:
        return sum(self.times_ms)

    @classmethod
    def parse(cls, data: Any, calls: int) -> "TimedBatchReply":
        """The reply to a batch of `calls` calls; raises ReplyMalformed for anything else."""
        data = _object(data, "a batch reply")
        return cls(_times(data, "times_ms", calls), _times(data, "stream_ms", calls, optional=True),
                   _times(data, "idle_ms", calls, optional=True), **_integrity(data))


def _strings(data: dict[str, Any], key: str) -> tuple[str, ...]:
    values = data.get(key)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ReplyMalformed(f"{key} must be a list of names")
    return tuple(values)


def _error_stats(data: Any) -> ErrorStats:
    """compare.compare_outputs's statistics as the worker sends them: every field, counts as whole
    numbers >= 0 and errors as numbers >= 0 (infinite where an output is not finite; never NaN)."""
    data = _object(data, "errors")
    names = {f.name for f in fields(ErrorStats)}
    required = {f.name for f in fields(ErrorStats) if f.name != "within_reference_error"}
    if not required <= set(data) <= names:
        raise ReplyMalformed(f"errors must hold {sorted(required)}, not {sorted(data)}")
    for name, value in data.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in ErrorStats.COUNTS and not (number and float(value).is_integer() and value >= 0):
            raise ReplyMalformed(f"errors.{name} holds {value!r}: a count of elements")
        if not number or math.isnan(value) or value < 0:
            raise ReplyMalformed(f"errors.{name} holds {value!r}: an error must be a number >= 0")
    return error_stats(data)


@dataclass(frozen=True)
class DeterminismReply(AfterImport):
    """The answer to `determinism` (runner.determinism): the candidate twice on identical inputs, its
    two outputs compared by the tight rule, and whether they are bitwise equal."""

    bitwise: bool
    errors: ErrorStats

    @classmethod
    def parse(cls, data: Any) -> "DeterminismReply":
        data = _object(data, "a determinism reply")
        return cls(_flag(data, "bitwise"), _error_stats(data.get("errors")), **_integrity(data))


@dataclass(frozen=True)
class AnticheatReply(AfterImport):
    """The answer to `anticheat` (runner.anticheat): the aten ops of one forward and those the backend
    disallows, both None where the op audit does not apply to the backend."""

    ops: tuple[str, ...] | None
    disallowed_ops: tuple[str, ...] | None

    @classmethod
    def parse(cls, data: Any) -> "AnticheatReply":
        data = _object(data, "an op audit's reply")
        if ("ops" in data) != ("disallowed_ops" in data):
            raise ReplyMalformed("an op audit reports both its ops and the disallowed ones, or neither")
        if "ops" not in data:
            return cls(None, None, **_integrity(data))
        return cls(_strings(data, "ops"), _strings(data, "disallowed_ops"), **_integrity(data))

    def checked(self) -> dict[str, Any]:
        """The audit as anticheat.judge_dynamic_checks reads it."""
        return {} if self.ops is None else {"ops": list(self.ops), "disallowed_ops": list(self.disallowed_ops or ())}


@dataclass(frozen=True)
class KernelAuditReply(AfterImport):
    """The answer to `kernel_audit` (runner.kernel_audit, checks_dynamic.audit_kernels): the kernels one
    forward launched, sorted into the candidate's own and the libraries'; `blind`, the profiler saw
    no device activity, not even the judge's canary (then no kernel is listed)."""

    own_kernels: tuple[str, ...]
    library_kernels: tuple[str, ...]
    blind: bool = False

    @classmethod
    def parse(cls, data: Any) -> "KernelAuditReply":
        data = _object(data, "a kernel audit's reply")
        kernels = _object(data.get("kernels"), "kernels")
        own, library, blind = _strings(kernels, "own_kernels"), _strings(kernels, "library_kernels"), \
            kernels.get("blind", False)
        if not isinstance(blind, bool):
            raise ReplyMalformed(f"kernels.blind holds {blind!r}: true or false")
        if blind and (own or library):
            raise ReplyMalformed("a blind kernel audit lists kernels it cannot have seen")
        return cls(own, library, blind, **_integrity(data))

    def checked(self) -> dict[str, Any]:
        """The audit as anticheat.judge_dynamic_checks reads it."""
        return {"kernels": {"own_kernels": list(self.own_kernels), "library_kernels": list(self.library_kernels)}}
