"""The in-process guard of a candidate's worker: an audit hook, installed before the candidate is
imported, that refuses to the candidate's Python code what it could use to read or change the judge.

Defeats a candidate that learns which timed calls will be checked, or rewrites what was measured, by
walking the interpreter's frames (sys._getframe, sys._current_frames, a traceback's or generator's
frame, inspect.stack), by walking the heap (gc.get_objects / get_referrers / get_referents), by
tracing the judge (sys.settrace, sys.setprofile), by reaching memory through ctypes, by replacing a
function's code (`f.__code__ = ...`), by starting processes (os.system, subprocess, exec, fork, spawn),
or by writing files outside the worker's scratch directory, however the call is spelled: the hook
sees the interpreter's audit events (PEP 578), so `getattr(builtins, "__import__")("g" + "c")`, a
module found through sys.modules or code run through exec reach it alike.

Who asked: the event is refused when the innermost frame that is neither the standard library's nor
code compiled from a string is the candidate's file; an event that trusted code raises on the
candidate's behalf is allowed (cutegen.runtime loading and launching the candidate's kernels through
ctypes, torch's load_inline building an extension, torch itself). Standard-library modules that use
frames only internally (collections.namedtuple, typing, enum, dataclasses, warnings, logging...) may
read frames for the candidate; those that hand frames back (inspect, traceback, sys) may not. So an
honest `gc.collect()`, `import inspect`, `inspect.signature`, a namedtuple or a warning pass.

A refusal raises `GuardRefused` in the candidate and is recorded where the candidate's Python code
cannot erase it (a closure the hook alone holds; the worker reads it through the function `install`
returns and puts it in every reply); the parent fails the verdict with `guard_refused`.

What remains possible: the candidate's kernels are native code (its .so, a load_inline extension),
which can read and write anything in the process, this hook and the judge's records included. What
still catches them is observed outside the process: the parent's clock on every timed batch
(clock.py), the verification of timed outputs that the parent chooses after each batch ran and the
reference process checks, the nonce each reply must echo, and, for writes, the kernel's own
confinement (Landlock, confine.py) where the machine has it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Callable

FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "gi_code", "cr_code", "ag_code"})
HEAP_EVENTS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
TRACE_EVENTS = frozenset({"sys.settrace", "sys.setprofile"})
PROCESS_EVENTS = frozenset({"os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.fork",
                            "os.forkpty", "os.spawn", "os.kill", "os.killpg"})
WRITE_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.truncate", "os.chmod", "os.chown",
                          "os.link", "os.symlink", "os.mkdir", "shutil.rmtree", "shutil.copyfile", "shutil.move"})
# Standard-library modules that read frames for their own use and never hand them to the caller.
INTERNAL_FRAME_USERS = ("collections", "typing", "enum", "dataclasses", "warnings", "logging", "abc",
                        "functools", "contextlib", "importlib", "threading", "weakref", "copyreg", "pickle")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class GuardRefused(RuntimeError):
    """An operation the judge's guard does not allow to candidate code."""


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(str(Path(paths[k]).resolve()) + os.sep for k in ("stdlib", "platstdlib") if k in paths)


def _is_write(args: tuple) -> bool:
    """Whether an `open` event's (path, mode, flags) opens for writing."""
    _, mode, flags = (tuple(args) + (None, None, None))[:3]
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def install(candidate_file: str | Path, scratch: str | Path) -> Callable[[], list[str]]:
    """Install the hook for the candidate at `candidate_file`, whose writes may go to `scratch` (and
    /dev, for device nodes). Returns the reader of the refusals recorded so far. An audit hook cannot
    be removed: one candidate per worker process, as the worker already serves."""
    candidate = str(candidate_file)  # as the import names it in the candidate's code objects
    scratch_dir = str(Path(scratch).resolve()) + os.sep
    stdlib = _stdlib_dirs()
    internal = tuple(os.sep + name + os.sep for name in INTERNAL_FRAME_USERS) + \
        tuple(os.sep + name + ".py" for name in INTERNAL_FRAME_USERS)
    refusals: list[str] = []
    busy = threading.local()
    getframe = sys._getframe

    def asker(frame) -> tuple[str | None, str | None]:
        """(the innermost frame's file, the first file outward that is neither stdlib nor '<...>')."""
        innermost = frame.f_code.co_filename if frame is not None else None
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith("<") and not _is_stdlib(name):
                return innermost, name
            frame = frame.f_back
        return innermost, None

    def _is_stdlib(name: str) -> bool:
        # An interpreter's own site-packages lies under its stdlib folder: packages there are not stdlib.
        return name.startswith(stdlib) and "-packages" + os.sep not in name

    def refused(event: str, args: tuple) -> str | None:
        if event in FRAME_EVENTS or (event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRIBUTES):
            kind = "frame access"
        elif event in HEAP_EVENTS:
            kind = "heap walk"
        elif event in TRACE_EVENTS:
            kind = "tracing"
        elif event.startswith("ctypes."):
            kind = "ctypes"
        elif event in PROCESS_EVENTS:
            kind = "process creation"
        elif event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
            kind = "code replacement"
        elif event == "open" and _is_write(args) and not _inside(args[0], scratch_dir):
            kind = f"a write outside the scratch directory ({args[0]})"
        elif event in WRITE_EVENTS and args and not _inside(args[0], scratch_dir):
            kind = f"a change outside the scratch directory ({args[0]})"
        else:
            return None
        innermost, who = asker(getframe(2))
        if who != candidate:
            return None
        if kind == "frame access" and innermost is not None and _is_stdlib(innermost) and \
                any(part in innermost for part in internal):
            return None  # a namedtuple, a warning, a typing construct: frames used inside, not handed out
        return f"{event}: {kind}"

    def hook(event: str, args: tuple) -> None:
        if getattr(busy, "on", False):
            return
        busy.on = True
        try:
            why = refused(event, args)
        finally:
            busy.on = False
        if why is not None:
            refusals.append(why)
            raise GuardRefused(f"refused by the judge's guard: {why}")

    sys.addaudithook(hook)
    return lambda: list(refusals)


def _inside(path: object, directory: str) -> bool:
    """Whether `path` (a str, bytes, path or file descriptor) lies in `directory` or /dev."""
    if isinstance(path, int):
        return True  # an open descriptor: the open that made it was judged
    try:
        resolved = str(Path(os.fsdecode(path)).resolve())
    except (TypeError, ValueError, OSError):
        return False
    return (resolved + os.sep).startswith(directory) or resolved.startswith("/dev/")
