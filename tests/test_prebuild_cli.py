"""`cutegen prebuild`: a machine without a GPU builds every candidate's kernels; another install of the
same toolkit and headers, at other paths, finds them (the split run's GPU side runs no nvcc for them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutegen.cli import main
from cutegen.config import AgentConfig, EvalConfig, RuntimeConfig
from cutegen.journal import Journal, start_run
from cutegen.runtime import find_cutlass_include
from cutegen.tasks import load_task

from helpers import needs_nvcc

REPO = Path(__file__).resolve().parents[1]

# A small kernel (no CuTe headers beyond the version, found only through the -I folder): builds in seconds.
CANDIDATE = '''
import torch
import torch.nn as nn

from cutegen.runtime import CuteKernel

SOURCE = r"""
#include <cuda_runtime.h>
#include <cutlass/version.h>
__global__ void scale_kernel(float const* x, float* y, int n, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * s;
}
extern "C" int scale(float const* x, float* y, int n, float s, cudaStream_t stream) {
  scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, n, s);
  return cudaGetLastError();
}
"""

_kernel = CuteKernel(SOURCE, {"scale": ("f32*", "f32*", "i32", "f32")}, name="scale")


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _kernel.scale(x, y, x.numel(), 2.0)
        return y
'''


def install_root(root: Path, headers: Path) -> Path:
    """The CUTLASS headers at another path (linked): another virtual environment or machine."""
    include = root / "lib" / "site-packages" / "cutlass_library" / "source" / "include"
    include.mkdir(parents=True)
    for name in ("cute", "cutlass"):
        (include / name).symlink_to(headers / name, target_is_directory=True)
    return include


def prebuild(args: list[str], capsys) -> dict:
    main(["prebuild", *args, "--json"])  # status 0: main() returns
    return json.loads(capsys.readouterr().out)


@pytest.mark.nvcc
@needs_nvcc
def test_prebuilt_kernels_are_found_from_another_install_root_and_in_a_run(tmp_path, capsys, monkeypatch):
    headers = find_cutlass_include(RuntimeConfig())
    folder = tmp_path / "candidates"
    folder.mkdir()
    (folder / "scale.py").write_text(CANDIDATE)
    for name in ("CUTEGEN_ARCH", "CUTEGEN_NVCC", "CUTLASS_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUTEGEN_CACHE", str(tmp_path / "cache"))

    monkeypatch.setenv("CUTEGEN_CUTLASS_INCLUDE", str(install_root(tmp_path / "cpu-side", headers)))
    first = prebuild([str(folder), "--arch", "sm_90a"], capsys)
    assert (first["candidates"], first["failed"], first["kernels_built"], first["kernels_cached"]) == (1, 0, 1, 0)
    assert first["results"][0]["kernels"][0]["name"] == "scale" and first["nvcc_s"] > 0

    monkeypatch.setenv("CUTEGEN_CUTLASS_INCLUDE", str(install_root(tmp_path / "gpu-side", headers)))
    main(["prebuild", str(folder), "--arch", "sm_90"])  # sm_90 is built as sm_90a: the same key
    lines = capsys.readouterr().out.splitlines()  # the lines a log shows
    assert lines[0] == "ok scale.py: scale cached"
    assert lines[-1].startswith("prebuild: 1 candidate(s), 0 kernel(s) built, 1 found in the cache, 0 failed")

    # A run directory: its candidates/ folder, built with the run's evaluation settings.
    journal = Journal.create(tmp_path / "run")
    start_run(journal, [load_task(REPO / "examples" / "tasks" / "swish_scale.py")], "exchange:", AgentConfig(),
              EvalConfig(backend="cute", device="cuda"))
    journal.put_text("candidates", CANDIDATE, ".py")
    journal.put_text("candidates", "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n", ".py")
    run = prebuild([str(journal.run_dir), "--arch", "sm_90a"], capsys)
    assert (run["candidates"], run["failed"], run["kernels_built"], run["kernels_cached"]) == (2, 0, 0, 1)


def test_prebuild_without_an_architecture_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUTEGEN_ARCH", raising=False)
    with pytest.raises(SystemExit) as usage:
        main(["prebuild", str(tmp_path)])
    assert usage.value.code == 2 and "--arch sm_90a" in capsys.readouterr().err


@pytest.mark.nvcc
@needs_nvcc
def test_a_load_inline_candidate_is_skipped_with_the_reason_not_failed(tmp_path, capsys, monkeypatch):
    """torch builds a load_inline extension where the candidate is imported, for that machine's torch and
    CUDA: the prebuild says so instead of importing it (which failed without CUDA_HOME)."""
    monkeypatch.setenv("CUTEGEN_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "candidates"
    folder.mkdir()
    (folder / "relu.py").write_text((REPO / "tests/fixtures/honest/cuda_relu.py").read_text())
    found = prebuild([str(folder), "--arch", "sm_90a"], capsys)
    assert (found["failed"], found["kernels_built"]) == (0, 0)
    assert found["results"][0]["ok"] and "load_inline" in found["results"][0]["skipped"]
    main(["prebuild", str(folder), "--arch", "sm_90a"])
    assert "nothing to build relu.py: a load_inline extension" in capsys.readouterr().out
