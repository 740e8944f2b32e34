"""Assembling a Verdict in the parent: checks accumulate, the first failure stops the evaluation.

Worker errors and deaths are turned into named failures with feedback a model can act on: the
distilled compiler error, the exception and the candidate's line, or what killed the worker.
"""

from __future__ import annotations

import re
import time
from typing import Any

from cutegen.records import CheckResult, ErrorStats, TimingStats, Verdict

LOG_TAIL_CHARS = 4000

_SIGNAL_HINTS = {
    "SIGSEGV": "a segmentation fault: host code (the launcher or a ctypes call) touched invalid memory",
    "SIGABRT": "an abort: a failed assertion or std::terminate in host code",
    "SIGKILL": "killed from outside the worker, often by the system's out-of-memory killer",
    "SIGBUS": "a bus error: a misaligned or unmapped host access",
    "SIGFPE": "an arithmetic fault in host code (an integer division by zero)",
}


class Stop(Exception):
    """Raised by `VerdictBuilder.fail`: the evaluation ends here."""


class VerdictBuilder:
    """Everything decided so far about one candidate."""

    def __init__(self, task_id: str, sha256: str, config: Any) -> None:
        self.base = {"task_id": task_id, "candidate_sha256": sha256, "track": config.track,
                     "backend": config.backend}
        self.checks: list[CheckResult] = []
        self.stage = "static"
        self.fields: dict[str, Any] = {}
        self.failure: str | None = None
        self.feedback = ""
        self.gpu_s = 0.0
        self.log_tail = ""
        self.stage_s: dict[str, float] = {}  # step -> wall seconds, summed over the step's calls, in first-call order
        self.checks_run: dict[str, None] = {}  # registry names (evaluate/checks.py), in the order they started

    def timed(self, step: str, started: float) -> None:
        """Add the wall seconds of one step since `started` (a time.perf_counter() value)."""
        self.add_s(step, time.perf_counter() - started)

    def add_s(self, step: str, seconds: float) -> None:
        """Add `seconds` to a step's (one the parent measured, or a part of one that a process of the
        judge's timed: the reference's share of a comparison)."""
        self.stage_s[step] = self.stage_s.get(step, 0.0) + seconds

    def add(self, check: CheckResult) -> None:
        self.checks.append(check)
        self.note_run(check.name)

    def note_run(self, *names: str) -> None:
        """Checks that judge the candidate from here on, whether or not they record a result."""
        self.checks_run.update(dict.fromkeys(names))

    def set(self, **fields: Any) -> None:
        self.fields.update(fields)

    def fail(self, check: str, feedback: str, detail: str | None = None) -> None:
        """Record a failed check at the current stage and stop. `check` is a registry name
        (evaluate/checks.py; tests/test_check_registry.py holds every name the evaluator passes here to it)."""
        if not any(c.name == check and not c.passed for c in self.checks):
            self.add(CheckResult(check, self.stage, False, detail if detail is not None else feedback))
        self.failure, self.feedback = check, feedback
        raise Stop(check)

    def fail_check(self, check: CheckResult, feedback: str | None = None) -> None:
        self.add(check)
        self.fail(check.name, feedback or f"{check.name}: {check.detail}")

    def verdict(self) -> Verdict:
        return Verdict(**self.base, passed=self.failure is None, stage=self.stage, failure=self.failure,
                       feedback=self.feedback, checks=tuple(self.checks),
                       gpu_s=round(self.gpu_s, 3) if self.gpu_s else None,
                       log_tail=self.log_tail[-LOG_TAIL_CHARS:],
                       stage_s=tuple((k, round(v, 3)) for k, v in self.stage_s.items()),
                       checks_run=tuple(self.checks_run), **self.fields)


def died_feedback(reason: str, detail: str, stage: str, timeout_s: float) -> str:
    """What to tell a model when the worker had to be killed or died."""
    if reason == "build_timeout":
        return (f"The build did not finish within {timeout_s:g} s and was killed. Reduce template"
                " instantiation depth, unrolling and the number of kernel variants.")
    if reason == "run_timeout":
        return (f"The {stage} stage did not finish within {timeout_s:g} s and the worker was killed: a"
                " kernel that never terminates (a loop bound or barrier that some threads never reach),"
                " a deadlock, or an infinite loop in Python.")
    if reason == "worker_crashed":
        hint = next((h for sig, h in _SIGNAL_HINTS.items() if sig in detail), "")
        return f"The worker process died: {detail}{': ' + hint if hint else ''}."
    return f"The worker's channel broke during {stage} ({detail})."


def crash_line(log_tail: str, candidate_file: str = "candidate.py") -> int | None:
    """The candidate's innermost line in the Python stack the worker printed when it crashed."""

    lines = re.findall(rf'File "(?:[^"]*/)?{re.escape(candidate_file)}", line (\d+)', log_tail)
    return int(lines[0]) if lines else None


def error_failure(error: dict[str, Any], stage: str) -> tuple[str, str]:
    """(failure name, feedback) for an exception the worker reported."""
    kind = error.get("kind", "exception")
    where = f" at line {error['candidate_line']} of the candidate" if error.get("candidate_line") else ""
    message = f"{error.get('type')}: {error.get('message', '').strip()}"[:1500]
    if kind == "build_error":
        distilled = error.get("distilled") or error.get("message", "")
        return "build_error", f"The build failed:\n{distilled.strip()[:2000]}"
    if kind == "guard_refused":
        return "guard_refused", (f"The judge's guard refused an operation{where} ({message}): candidate code may not"
                                 " read frames or the heap, trace, use ctypes, start processes, replace code or"
                                 " write outside its working directory.")
    if kind == "write_outside_scratch":
        return "write_outside_scratch", (f"A write outside the candidate's working directory was refused{where}"
                                         f" ({message}): write only in the working directory or its temporary folder.")
    if kind == "out_of_memory":
        return "out_of_memory", f"Out of memory during {stage}{where}: {message}"
    if kind == "transfer_space":
        return "transfer_space", (f"Not a verdict on the candidate: during {stage} its outputs could not be handed"
                                  f" to the reference ({message}). Free disk space where the evaluator works"
                                  " and evaluate it again.")
    if kind in ("illegal_memory_access", "cuda_error"):
        return kind, (f"CUDA error during {stage}{where}: {message}\nCheck index arithmetic and the"
                      " predication of residue tiles; launch configuration limits; alignment of vector accesses.")
    name = "import_error" if stage == "build" else "runtime_error"
    verb = "importing the candidate" if stage == "build" else f"running the candidate ({stage})"
    return name, f"{error.get('type')} while {verb}{where}: {error.get('message', '').strip()[:1500]}"


def correct_feedback(errors: ErrorStats | None, timed: bool = True) -> str:
    text = (f"Correct: {errors.total_elements} output elements over all trials within atol {errors.atol:g}"
            f" + rtol {errors.rtol:g} (max abs error {errors.max_abs_error:.3g})." if errors else "Correct.")
    if errors and errors.within_reference_error:
        text += (f" {errors.within_reference_error} of them only within the reference's own rounding error"
                 " of the float64 result.")
    return text if timed else text + " Not timed."


def timing_feedback(timing: TimingStats, fields: dict[str, Any], errors: ErrorStats | None) -> str:
    parts = [correct_feedback(errors)]
    parts.append(f"Median {timing.median_ms:.4g} ms (IQR {timing.iqr_ms:.3g} ms, {timing.trials} trials).")
    eager, compiled = fields.get("eager"), fields.get("compiled")
    if eager is not None:
        parts.append(f"{fields['speedup_vs_eager']:.3g}x vs eager PyTorch ({eager.median_ms:.4g} ms).")
    if compiled is not None:
        parts.append(f"{fields['speedup_vs_compile']:.3g}x vs torch.compile ({compiled.median_ms:.4g} ms).")
    if fields.get("sol_fraction") is not None:
        parts.append(f"{fields['sol_fraction'] * 100:.1f}% of the reference algorithm's work bound"
                     f" ({fields['sol_bound_ms']:.4g} ms).")
    if fields.get("noise_pct") is not None:
        parts.append(f"Baseline noise: {fields['noise_pct']:.1f}%.")
    return " ".join(parts)


# ------------------------------------------------------------------ which of two verdicts is faster


def required_gain(new: Verdict, best: Verdict, min_gain: float) -> float:
    """The relative gain that counts: `min_gain`, or the baseline's measured timing noise when that is
    larger (a difference within the spread of two identical measurements is not a gain)."""
    noise = max((v.noise_pct or 0.0) for v in (new, best)) / 100.0
    return max(min_gain, noise)


def faster(new: Verdict, best: Verdict, min_gain: float) -> bool:
    """`new` beats `best` by more than `required_gain` (relative), by median time, else by eager speedup."""
    gain = required_gain(new, best, min_gain)
    if new.timing is not None and best.timing is not None:
        return new.timing.median_ms < best.timing.median_ms * (1.0 - gain)
    if new.speedup_vs_eager is not None and best.speedup_vs_eager is not None:
        return new.speedup_vs_eager > best.speedup_vs_eager * (1.0 + gain)
    return False
