"""The test-run report of tests/conftest.py (CUTEGEN_TEST_REPORT): each test's outcome is in the file
as soon as the test ends, with a failure's text, so that a GPU run killed at its time limit keeps it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_outcome_is_written_when_its_test_ends(tmp_path):
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "def test_ok():\n    pass\n\n"
        "def test_wrong():\n    assert 1 + 1 == 3, 'arithmetic is off'\n\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n\n"
        "def test_last():\n"  # the file already holds the three earlier outcomes while this one runs
        f"    text = open({str(tmp_path / 'report.txt')!r}).read()\n"
        "    assert 'PASSED' in text and 'FAILED' in text and 'SKIPPED' in text\n")
    env = {**os.environ, "CUTEGEN_TEST_REPORT": str(tmp_path / "report.txt")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr  # test_wrong fails, test_last passes
    lines = (tmp_path / "report.txt").read_text().splitlines()
    heads = [line.split(" (")[0] for line in lines if line.startswith(("PASSED", "FAILED", "SKIPPED"))]
    assert heads == ["PASSED test_sample.py::test_ok", "FAILED test_sample.py::test_wrong",
                     "SKIPPED test_sample.py::test_skipped", "PASSED test_sample.py::test_last"]
    assert any("arithmetic is off" in line for line in lines)
