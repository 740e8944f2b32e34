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


def _json_exit(*args: str, **env: str) -> tuple[int, dict, str]:
    """Run `cutegen ... --json`; stdout must be exactly one JSON object, whatever the exit."""
    import json
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith("CUTEGEN_")}
    done = subprocess.run([sys.executable, "-m", "cutegen", *args, "--json"], capture_output=True, text=True,
                          env={**environment, **env})
    return done.returncode, json.loads(done.stdout), done.stderr


def test_eval_json_without_a_gpu_is_one_object_with_exit_76(tmp_path):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the exit of a machine without a GPU")
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    code, answer, err = _json_exit("eval", str(repo / "examples" / "candidates" / "swish_scale_cute.py"),
                                   "--task", str(repo / "examples" / "tasks" / "swish_scale.py"),
                                   CUTEGEN_CACHE=str(tmp_path))
    assert code == 76 and answer["exit_status"] == 76 and answer["reason"] == "needs_gpu"
    assert answer["task_id"] == "swish_scale" and "needs a CUDA device" in answer["message"]
    assert "needs a GPU" in err  # the person at the terminal is told too


def test_eval_json_usage_errors_are_one_object_with_exit_2(tmp_path):
    code, answer, err = _json_exit("eval", str(tmp_path / "missing.py"), "--task", str(tmp_path / "missing.py"))
    assert (code, answer["exit_status"], answer["reason"]) == (2, 2, "usage_error")
    assert "does not exist" in answer["message"] and "Fix:" in err
    code, answer, err = _json_exit("eval", str(tmp_path / "candidate.py"))  # no --task: click refuses it
    assert (code, answer["exit_status"], answer["reason"]) == (2, 2, "usage_error")
    assert "--task" in answer["message"] and "--task" in err
