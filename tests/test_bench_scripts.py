"""The GPU bench scripts' own plumbing, on CPU: a mistake here costs a whole device call."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from fixture_headers import header, task_path

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def evaluator_bench():
    sys.path.insert(0, str(REPO / "bench"))  # the scripts import their neighbour _common.py
    try:
        spec = importlib.util.spec_from_file_location("evaluator_h200_under_test", REPO / "bench" / "evaluator_h200.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(REPO / "bench"))


FIXTURE_FOLDERS = ("tests/fixtures/honest", "tests/fixtures/cheats", "tests/fixtures/faults", "examples/candidates")


@pytest.mark.parametrize("folder", FIXTURE_FOLDERS)
def test_every_file_the_evaluator_bench_judges_finds_its_task(evaluator_bench, folder):
    """Each example names its task in its docstring; fixtures in headers or by file name. The bench
    reads them by the tests' own rule (fixture_headers)."""
    assert evaluator_bench.task_path is task_path and evaluator_bench.header is header
    for path in sorted((REPO / folder).glob("*.py")):
        assert task_path(path, REPO).is_file(), path
    examples = {p.name: task_path(p, REPO).stem for p in (REPO / "examples" / "candidates").glob("*.py")}
    assert examples["gemm_bf16_wgmma.py"] == "matmul_bf16"
    assert examples["conv2d_implicit_gemm_cute.py"] == "conv2d"
    assert examples["matmul_3xtf32_cute.py"] == "matmul"
