"""Compile checks whose exact inputs already passed, recorded in tests/fixtures/compiled.jsonl, are not
run again. A check's outcome is a function of its inputs: the source with the runtime's footer, the
flags, the arch, nvcc's version and the CUTLASS headers' id (all in `cutegen.runtime.check_key`), and
the host compiler nvcc preprocesses with (added here). Change any of them (edit an example, bump
CUTLASS or nvcc, another gcc) and the key is new: the check compiles. Compiled again unchanged, the
shipped examples cost a 2-core CI machine a minute per run for an outcome that cannot differ.

    CUTEGEN_TEST_RECOMPILE=1        compile every source, recorded or not
    CUTEGEN_TEST_RECORD_COMPILES=1  append each source that compiled to the record

The record is written only by checks that compiled (`remember` after the compile returned), one JSON
line per key: the key, what it compiled, nvcc's release, the host compiler and when."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parent / "fixtures" / "compiled.jsonl"
RECHECK = "CUTEGEN_TEST_RECOMPILE"
WRITE = "CUTEGEN_TEST_RECORD_COMPILES"


@functools.lru_cache(maxsize=1)
def host_compiler() -> str:
    """The first line of `gcc --version` (nvcc's default host compiler, which preprocesses the source)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return "none"
    done = subprocess.run([gcc, "--version"], capture_output=True, text=True, timeout=30)
    return (done.stdout.splitlines() or ["unknown"])[0].strip()


def record_key(check_key: str) -> str:
    return hashlib.sha256(f"{check_key}\n{host_compiler()}".encode()).hexdigest()


def recorded(path: Path = RECORD) -> frozenset[str]:
    if not path.is_file():
        return frozenset()
    return frozenset(json.loads(line)["key"] for line in path.read_text(encoding="utf-8").splitlines() if line)


def compiled_before(check_keys: list[str], path: Path = RECORD) -> bool:
    """Whether every one of `check_keys` (at least one) is in the record, and RECHECK is unset."""
    if os.environ.get(RECHECK) or not check_keys:
        return False
    done = recorded(path)
    return all(record_key(k) in done for k in check_keys)


def skip_if_compiled_before(what: str, check_keys: list[str], path: Path = RECORD) -> None:
    """Skip the calling test when `compiled_before(check_keys)`."""
    if compiled_before(check_keys, path):
        pytest.skip(f"{what}: compiled with these exact inputs before ({path.name}); {RECHECK}=1 compiles it again")


def remember(what: str, check_keys: list[str], path: Path = RECORD) -> None:
    """Append `check_keys`, which compiled, to the record (only with WRITE set; each line is one
    O_APPEND write, so parallel test workers do not interleave)."""
    if not os.environ.get(WRITE):
        return
    from cutegen.config import RuntimeConfig
    from cutegen.runtime import find_nvcc, nvcc_release, nvcc_version

    release = nvcc_release(nvcc_version(find_nvcc(RuntimeConfig())))
    done = recorded(path)
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    for key in check_keys:
        if record_key(key) in done:
            continue
        line = json.dumps({"key": record_key(key), "compiled": what, "nvcc": release, "host": host_compiler(),
                           "recorded_utc": now}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
