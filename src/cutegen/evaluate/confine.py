"""Kernel-level confinement of a candidate's worker: Landlock (Linux 5.13+) before the candidate is
imported, so that nothing in the process, native code and child processes included, writes outside
the places a build and a run need.

Defeats a candidate that writes into installed packages (appending to site-packages/torch/__init__.py
runs its code in every later process that imports torch), into the run directory or the evaluator's
caches of baselines and probes, or anywhere else its user may write, from Python or from its kernels'
native code. The audit hook (guard.py) refuses such writes to the candidate's Python code and names
them; Landlock holds for everything in the process, where the kernel has it.

Writable after `confine`: the worker's scratch directory, /dev (device nodes open read-write), /proc
(the process's own files), the temporary directory (compilers), and the folders given (the build
cache and torch's extension folder, where the candidate's kernels are compiled). Reads are not
restricted. Not defended: writes inside those folders, the build cache among them (a candidate could
place a file in another build's entry; a build is found by its content's key and checked by nothing
more), and everything on a kernel without Landlock (then only the audit hook stands: `confine`
returns False and the verdict's check says so).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Iterable

# Syscall numbers of landlock_create_ruleset / add_rule / restrict_self: the same on x86_64 and arm64.
_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# LANDLOCK_ACCESS_FS_*: every right that changes the file system (by ABI version that knows it).
_WRITE_RIGHTS_V1 = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | \
    (1 << 11) | (1 << 12)  # write_file, remove_dir/file, make_char/dir/reg/sock/fifo/block/sym
_REFER, _TRUNCATE = 1 << 13, 1 << 14


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (another OS, an old kernel, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _rights(abi: int) -> int:
    return _WRITE_RIGHTS_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)


def confine(scratch: str | Path, writable: Iterable[str | Path] = ()) -> bool:
    """Forbid this process (and what it starts) every change to the file system outside `scratch`,
    /dev, /proc, the temporary directory and `writable` (those that exist). Irreversible. Returns
    whether Landlock is in force (False where the kernel has none)."""
    abi = landlock_abi()
    if abi == 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    rights = _rights(abi)
    attr = _RulesetAttr(rights)
    ruleset = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        places = [scratch, "/dev", "/proc", os.environ.get("TMPDIR") or "/tmp", *writable]
        for place in {str(Path(p)) for p in places if p and Path(p).exists()}:
            fd = os.open(place, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights, fd)
                libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                             ctypes.c_uint32(0))
            finally:
                os.close(fd)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        return libc.syscall(_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0
    finally:
        os.close(ruleset)
