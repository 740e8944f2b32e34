"""Every shipped example candidate compiles: each CuteKernel in examples/candidates/*.py is built
with nvcc for sm_90a (compile-only: no GPU needed). Marked nvcc; skipped when nvcc or the CUTLASS
headers are missing."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from cutegen.config import RuntimeConfig
from cutegen.runtime import find_kernels

from helpers import needs_nvcc

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = sorted((REPO / "examples" / "candidates").glob("*.py"))


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"candidate_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # declaring a CuteKernel compiles nothing: importing is cheap
    return module


def test_there_are_example_candidates():
    assert CANDIDATES, "examples/candidates/ holds no candidate"


@pytest.mark.parametrize("path", CANDIDATES, ids=[p.stem for p in CANDIDATES])
def test_candidate_declares_kernels_and_a_model(path):
    module = _import(path)
    assert find_kernels(module), f"{path.name} declares no CuteKernel"
    assert hasattr(module, "ModelNew")


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("path", CANDIDATES, ids=[p.stem for p in CANDIDATES])
def test_candidate_kernels_compile_for_sm90a(path, tmp_path):
    config = RuntimeConfig(cache_dir=tmp_path / "cache", arch="sm_90a")
    for kernel in find_kernels(_import(path)):
        started = time.perf_counter()
        # The device code alone (nvcc -cubin; the front end checks the launchers too): the full builds
        # are the GPU tests' (tests/test_fixtures_gpu.py judges every example candidate).
        result = kernel.check(config)  # raises BuildError with the distilled errors on failure
        print(f"{path.name}:{kernel.name}: cold device compile {time.perf_counter() - started:.1f} s")
        assert not result.cached and result.library_path.is_file()
