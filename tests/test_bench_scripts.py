"""The GPU bench scripts' own plumbing, on CPU: a mistake here costs a whole device call."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

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
    """Each example names its task in its docstring; fixtures in headers or by file name."""
    for path in sorted((REPO / folder).glob("*.py")):
        task = evaluator_bench.task_of(path, evaluator_bench.headers(path))
        assert task.path.is_file(), path
    examples = {p.name: evaluator_bench.task_of(p, {}).task_id for p in (REPO / "examples" / "candidates").glob("*.py")}
    assert examples.get("gemm_bf16_wgmma.py", "matmul_bf16") == "matmul_bf16"
    assert examples.get("conv2d_implicit_gemm_cute.py", "conv2d") == "conv2d"
