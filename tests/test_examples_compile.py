"""Every shipped example candidate compiles: each CuteKernel in examples/candidates/*.py is built
with nvcc for sm_90a (compile-only: no GPU needed). Marked nvcc; skipped when nvcc or the CUTLASS
headers are missing, and for an example whose exact inputs compiled before (tests/compile_record.py)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from cutegen.config import RuntimeConfig
from cutegen.runtime import check_key, find_kernels

from compile_record import remember, skip_if_compiled_before
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
    kernels = find_kernels(_import(path))
    assert kernels, f"{path.name} declares no CuteKernel"
    keys = [check_key(kernel.source, config) for kernel in kernels]
    skip_if_compiled_before(path.name, keys)  # tests/compile_record.py: the same inputs passed before
    for kernel, key in zip(kernels, keys):
        started = time.perf_counter()
        # The device code alone (nvcc -cubin; the front end checks the launchers too): the full builds
        # are the GPU tests' (tests/test_fixtures_gpu.py judges every example candidate).
        result = kernel.check(config)  # raises BuildError with the distilled errors on failure
        print(f"{path.name}:{kernel.name}: cold device compile {time.perf_counter() - started:.1f} s")
        assert not result.cached and result.library_path.is_file() and result.cache_key == key
    remember(path.name, keys)


@needs_nvcc
def test_the_record_skips_only_the_very_inputs_that_compiled(tmp_path, monkeypatch):
    """A recorded key skips its check; one more byte of source, another host compiler, or
    CUTEGEN_TEST_RECOMPILE=1 compiles again, and without CUTEGEN_TEST_RECORD_COMPILES nothing is written."""
    import compile_record

    record = tmp_path / "compiled.jsonl"
    config = RuntimeConfig(cache_dir=tmp_path / "cache", arch="sm_90a")
    source = find_kernels(_import(CANDIDATES[0]))[0].source
    key = check_key(source, config)
    monkeypatch.delenv(compile_record.RECHECK, raising=False)
    monkeypatch.delenv(compile_record.WRITE, raising=False)
    compile_record.remember("x", [key], record)
    assert not record.exists()
    monkeypatch.setenv(compile_record.WRITE, "1")
    compile_record.remember("x", [key], record)
    with pytest.raises(pytest.skip.Exception):
        compile_record.skip_if_compiled_before("x", [key], record)
    compile_record.skip_if_compiled_before("x", [check_key(source + " ", config)], record)  # edited: runs
    compile_record.skip_if_compiled_before("x", [key, check_key(source + " ", config)], record)
    monkeypatch.setenv(compile_record.RECHECK, "1")
    compile_record.skip_if_compiled_before("x", [key], record)
    monkeypatch.delenv(compile_record.RECHECK)
    monkeypatch.setattr(compile_record, "host_compiler", lambda: "clang 99")
    compile_record.skip_if_compiled_before("x", [key], record)
