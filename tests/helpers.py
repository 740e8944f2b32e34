"""Helpers shared by several test modules, imported as `from helpers import ...` (pytest puts tests/
on sys.path, as for `from test_report_html import ...`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixture_headers import backends, header, task_path  # noqa: F401 - re-exported for the tests


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
