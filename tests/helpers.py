"""Helpers shared by several test modules, imported as `from helpers import ...` (pytest puts tests/
on sys.path, as for `from test_report_html import ...`)."""

from __future__ import annotations

from pathlib import Path

import pytest


def header(path: Path) -> dict[str, str]:
    """The `# key: value` lines at the top of a cheat or honest fixture (exploit, caught-by, task,
    task-file, backend, needs); the first value of a key counts."""
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() in ("exploit", "caught-by", "task", "task-file", "backend", "needs"):
            fields.setdefault(key.strip(), value.strip())
    return fields


def task_path(path: Path, repo: Path) -> Path:
    """The task file a fixture is judged against: its `# task-file:` (repo-relative; a task made for
    one fixture, under tests/fixtures/tasks/) or else examples/tasks/<task>.py, where a shipped
    example without a `# task:` header is named after its task (swish_scale_cute.py)."""
    fields = header(path)
    if fields.get("task-file"):
        return repo / fields["task-file"]
    return repo / "examples" / "tasks" / f"{fields.get('task') or path.stem.removesuffix('_cute')}.py"


def toolchain_problem() -> str | None:
    """Why nvcc builds cannot run here (nvcc or the CUTLASS headers missing), or None when they can."""
    from cutegen.config import RuntimeConfig
    from cutegen.errors import ToolchainError
    from cutegen.runtime import find_cutlass_include, find_nvcc

    try:
        find_nvcc(RuntimeConfig())
        find_cutlass_include(RuntimeConfig())
    except ToolchainError as err:
        return str(err)
    return None


needs_nvcc = pytest.mark.skipif(toolchain_problem() is not None, reason="nvcc or the CUTLASS headers are missing")
