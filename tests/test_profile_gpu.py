"""The real Nsight Compute on a GPU: a profile of the elementwise example, its units against what the
kernel must move, and the GEMM example's instruction mix. Needs CUDA, ncu and nvcc (skipped otherwise);
tests/test_profile_agreement_gpu.py measures the same at larger sizes and records the results."""

from __future__ import annotations

from pathlib import Path

import pytest

from cutegen.config import EvalConfig, ProfileConfig, RuntimeConfig
from cutegen.profile import profile_candidate, profile_text
from cutegen.profile.run import find_tool
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc,
              pytest.mark.skipif(find_tool(None, "ncu") is None, reason="Nsight Compute (ncu) is not installed")]


@pytest.fixture(scope="module")
def eval_config(tmp_path_factory, shared_build_cache) -> EvalConfig:
    root = tmp_path_factory.mktemp("profile")
    return EvalConfig(cache_dir=root / "eval", runtime=RuntimeConfig(cache_dir=shared_build_cache))


def test_elementwise_profile_moves_the_bytes_the_task_defines(eval_config):
    task = load_task(REPO / "examples" / "tasks" / "swish_scale.py")  # x: 256 x 4096 float32
    profile = profile_candidate(REPO / "examples" / "candidates" / "swish_scale_cute.py", task, ProfileConfig(),
                                eval_config)
    tensor_bytes = 256 * 4096 * 4
    assert len(profile.kernels) == 1 and "swish_scale_kernel" in profile.kernels[0].display_name
    kernel = profile.kernels[0]
    assert 1e-7 < kernel.duration_s < 1e-3  # seconds, not nanoseconds or microseconds
    assert kernel.dram_read_bytes == pytest.approx(tensor_bytes, rel=0.15)
    # The 4 MB output fits in the L2 (50 MB), which writes it back after the kernel, where ncu no
    # longer counts: the H200 showed no DRAM write at all for a GEMM's 1 MB output.
    assert kernel.dram_write_bytes <= 1.15 * tensor_bytes
    (mix,) = [m for m in profile.instruction_mix if m.function == kernel.name]
    assert mix.widest_global_load_bits == 128 and mix.tensor_core == 0
    assert profile.wall_s < 60
    text = profile_text(profile)
    assert "Diagnosis:" in text and "swish_scale_kernel" in text


def test_gemm_profile_reports_ffma_only(eval_config):
    task = load_task(REPO / "examples" / "tasks" / "matmul.py")
    profile = profile_candidate(REPO / "examples" / "candidates" / "matmul_cute.py", task, ProfileConfig(),
                                eval_config)
    (mix,) = profile.instruction_mix
    assert mix.ffma > 0 and mix.hmma == mix.hgmma == 0
    assert any("FFMA only" in finding for finding in profile.findings)
    assert profile.kernels[0].ffma_thread_instructions == pytest.approx(512 * 384 * 256, rel=0.01)  # one per multiply-add
