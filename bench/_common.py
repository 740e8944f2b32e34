"""Helpers shared by the bench scripts. A script runs as `python3 bench/<script>.py`, so bench/ is first
on sys.path and `from _common import ...` finds this module. The scripts arrange CLI calls; what they
measure is the CLI's (and the GPU tests': `pytest -m gpu`, tests/results_table.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cutegen_json(args: list[str], env: Mapping[str, str], timeout_s: float) -> dict[str, Any]:
    """`python3 -m cutegen ARGS` (ARGS asking for --json): its JSON object, or {"error": the output's
    end} when it printed none (a crash, a timeout)."""
    try:
        done = subprocess.run([sys.executable, "-m", "cutegen", *args], capture_output=True, text=True,
                              env=dict(env), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout_s:g} s"}
    try:
        found = json.loads(done.stdout)
    except ValueError:
        return {"error": (done.stdout[-1000:] + done.stderr[-1500:]), "exit": done.returncode}
    return found if isinstance(found, dict) else {"value": found}


def load_module(path: Path, name: str) -> Any:
    """The Python file at `path` imported as a module named `name` (a task, or a candidate's file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shown(text: str, repo: Path, places: Mapping[Path, str]) -> str:
    """`text` naming no path of the machine it ran on: the interpreter as python3, each of `places` by
    its name (the output folder as $OUT...), and paths in the repository relative to it."""
    text = text.replace(sys.executable, "python3")
    for path, name in places.items():
        text = text.replace(str(path), name)
    return text.replace(str(repo) + os.sep, "")
