"""The command line as a newcomer meets it."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cutegen", *args], capture_output=True, text=True)


def test_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0
    assert "tasks" in out.stdout


def test_user_error_is_one_paragraph_without_traceback(tmp_path):
    out = run("tasks", str(tmp_path / "missing.py"))
    assert out.returncode == 2
    assert "does not exist" in out.stderr and "Fix:" in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_option_is_a_usage_error():
    out = run("tasks", "--bogus")
    assert out.returncode == 2
    assert "No such option" in out.stderr and "Traceback" not in out.stderr
