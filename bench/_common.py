"""Helpers shared by the bench scripts. A script runs as `python3 bench/<script>.py`, so bench/ is first
on sys.path and `from _common import ...` finds this module."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def run_section(name: str, namespace: Mapping[str, Any], ctx: dict[str, Any], results: dict[str, Any],
                write_report: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run section NAME of a bench script, the function `section_NAME` of `namespace` (the script's
    globals()), on `ctx`. Its data, or the traceback (an unknown or failing section keeps the others'
    results), and its wall time go into results["sections"][name]; then the report is written again,
    so a run cut short keeps what it did. Returns the section's data."""
    started = time.perf_counter()
    try:
        data = namespace[f"section_{name}"](ctx)
    except Exception:  # noqa: BLE001 - keep the other sections' results
        data = {"error": traceback.format_exc()}
    data["wall_s"] = time.perf_counter() - started
    results["sections"][name] = data
    write_report(results)
    return data


def check_lines(result: Mapping[str, Any]) -> list[str]:
    """A script's checks as a markdown table (result["checks"]: name, passed, detail), then its error
    and traceback when it stopped on one."""
    lines = ["", "| check | passed | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {'yes' if c['passed'] else 'NO'} | {str(c['detail']).replace('|', '/')[:200]} |"
              for c in result["checks"]]
    if result.get("error"):
        lines += ["", f"Error: {result['error']}", "", "```", result.get("traceback", ""), "```"]
    return lines


def shown(text: str, repo: Path, places: Mapping[Path, str]) -> str:
    """`text` naming no path of the machine it ran on: the interpreter as python3, each of `places` by
    its name (the output folder as $OUT...), and paths in the repository relative to it."""
    text = text.replace(sys.executable, "python3")
    for path, name in places.items():
        text = text.replace(str(path), name)
    return text.replace(str(repo) + os.sep, "")
