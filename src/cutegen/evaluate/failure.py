"""What a worker's failure is, as the parent receives it: the kind of an exception raised in a worker
process (a write the confinement refused, an out-of-memory, a build error, a CUDA error...) and the
description sent back in place of a result (`describe_error`: kind, message, the candidate's line, a
bounded traceback). The worker's command loop (protocol.py) and the trusted builds of a confined
worker's kernels (confine.build_reported) both describe their failures here."""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path
from typing import Any

from cutegen.errors import BuildError, ToolchainError
from cutegen.evaluate.context import CANDIDATE_FILE

_MAX_TEXT = 6000

_CUDA_KINDS = (
    ("out_of_memory", re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
                                 r"can't allocate memory|Tried to allocate", re.I)),
    ("illegal_memory_access", re.compile(r"illegal memory access|cudaErrorIllegalAddress|"
                                         r"CUDA_ERROR_ILLEGAL_ADDRESS", re.I)),
    ("cuda_error", re.compile(r"CUDA error|cudaError|CUDA_ERROR|misaligned address|"
                              r"unspecified launch failure|device-side assert|KernelError", re.I)),
)


def classify_error(err: BaseException, message: str) -> str:
    """The failure kind of an exception raised in a worker: guard_refused, transfer_space,
    write_outside_scratch, out_of_memory, build_error, toolchain, illegal_memory_access, cuda_error or
    exception (the first that matches, in that order)."""
    if type(err).__name__ == "GuardRefused" or "refused by the judge's guard" in message:
        return "guard_refused"
    if type(err).__name__ == "TransferSpaceError":
        return "transfer_space"  # the machine's disk (transfer.py): reported as infrastructure
    if refused_write(err, message, os.getcwd()) is not None:
        return "write_outside_scratch"  # refused by the process's confinement (confine.py)
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return "out_of_memory"
    if isinstance(err, BuildError) or "Error building extension" in message:
        return "build_error"
    if isinstance(err, ToolchainError):
        return "toolchain"
    for kind, pattern in _CUDA_KINDS:
        if pattern.search(message) or pattern.search(type(err).__name__):
            return kind
    return "exception"


# A child process's report of a refused write, found in the error's message: Python's wording, or the
# C library's (`PATH: Permission denied`, a shell's or a native helper's).
_DENIED = re.compile(r"\[Errno 13\] Permission denied: '([^']+)'|(/[^\s:'\"]+): Permission denied")


def refused_write(err: BaseException, message: str, scratch: str | Path) -> str | None:
    """The path outside `scratch` whose write the confinement refused, as a worker's exception shows
    it: a PermissionError (raised, or chained under what the candidate raised) naming it, or a child
    process's report of one in the message; None otherwise. A path its user may not write by its own
    permissions is not the confinement's refusal."""
    inside = str(Path(scratch).resolve()) + os.sep
    names: list[str] = []
    seen: BaseException | None = err
    for _ in range(8):  # the candidate's chain of causes, bounded
        if seen is None:
            break
        if isinstance(seen, PermissionError):
            names += [os.fsdecode(n) for n in (seen.filename, seen.filename2) if isinstance(n, (str, bytes))]
        seen = seen.__cause__ or seen.__context__
    names += [python or libc for python, libc in _DENIED.findall(message)]
    for name in names:
        path = os.path.abspath(os.path.join(str(scratch), name))
        if not (path + os.sep).startswith(inside) and _user_may_write(path):
            return path
    return None


def _user_may_write(path: str) -> bool:
    """Whether the file's own permissions let this user write it (or create it in its nearest
    existing folder): os.access does not consult Landlock."""
    probe = path
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return os.access(probe, os.W_OK)


def _safe_str(err: BaseException) -> str:
    try:
        return str(err)[:_MAX_TEXT]
    except BaseException:  # noqa: BLE001 - a candidate's exception may break its own __str__
        return "<unprintable exception>"


def describe_error(err: BaseException) -> dict[str, Any]:
    """What the parent needs to explain an exception: kind, message, the candidate's line, a traceback."""
    message = _safe_str(err)
    try:
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))[-_MAX_TEXT:]
    except BaseException:  # noqa: BLE001
        tb = ""
    line = None
    frame = err.__traceback__
    while frame is not None:
        if os.path.basename(frame.tb_frame.f_code.co_filename) == CANDIDATE_FILE:
            line = frame.tb_lineno
        frame = frame.tb_next
    described = {"kind": classify_error(err, message), "type": type(err).__name__, "message": message,
                 "traceback": tb, "candidate_line": line}
    for attr in ("distilled", "log_tail"):
        if isinstance(getattr(err, attr, None), str):
            described[attr] = getattr(err, attr)[-_MAX_TEXT:]
    return described
