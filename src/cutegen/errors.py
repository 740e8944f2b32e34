"""Errors a user can act on.

Every error cutegen raises on bad input says two things in one paragraph: what is wrong (naming the
file, setting or value) and what to do about it. The CLI prints `str(err)` and exits non-zero with no
traceback, so the message must stand on its own.
"""

from __future__ import annotations


class CutegenError(Exception):
    """Base class: `problem` says what went wrong, `fix` says how to put it right."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem.strip()
        self.fix = fix.strip()
        super().__init__(f"{self.problem} Fix: {self.fix}")


class TaskError(CutegenError):
    """A task file or suite cannot be loaded or traced."""


class ConfigError(CutegenError):
    """A setting, selector or command-line value is invalid."""


class ToolchainError(CutegenError):
    """nvcc, the CUTLASS headers or a GPU the build needs is missing or unusable."""


class ClusterError(CutegenError):
    """The cluster that runs evaluations (an executor's) cannot take or finish them: no free GPU, or an
    evaluation lost with its node more times than the retries allow."""


class BuildError(CutegenError):
    """nvcc rejected a source; `distilled` holds the first errors, short enough for a model."""

    def __init__(self, problem: str, fix: str, distilled: str, log_tail: str = "") -> None:
        self.distilled = distilled
        self.log_tail = log_tail
        super().__init__(f"{problem}\n{distilled}\n", fix)


class LaunchError(CutegenError):
    """A compiled launcher was called with arguments it cannot take (device, dtype, layout, count)."""
