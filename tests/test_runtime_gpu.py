"""cutegen.runtime on a GPU: the example candidate against PyTorch, streams, errors from launchers.

Marked gpu: skipped without a CUDA device (the H200 run keeps its results in bench/results/).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cutegen.config import RuntimeConfig
from cutegen.errors import LaunchError
from cutegen.runtime import CuteKernel, KernelError, detect_arch, find_kernels, use_config

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "candidates" / "swish_scale_cute.py"

PROBE_SOURCE = """\
#include <cuda_runtime.h>
#include <cstdint>
__global__ void write_value(int64_t* out, int64_t value) { *out = value; }
// Writes the stream handle it was given into out, on that stream.
extern "C" int which_stream(int64_t* out, cudaStream_t stream) {
  write_value<<<1, 1, 0, stream>>>(out, reinterpret_cast<int64_t>(stream));
  return cudaGetLastError();
}
extern "C" int fail_with(int code, cudaStream_t stream) { return code; }
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> RuntimeConfig:
    return RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"))  # arch read from the device


@pytest.fixture(scope="module")
def example(config):
    spec = importlib.util.spec_from_file_location("swish_scale_cute", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for kernel in find_kernels(module):
        kernel.build(config)
    return module


@pytest.fixture(scope="module")
def probe(config) -> CuteKernel:
    kernel = CuteKernel(PROBE_SOURCE, {"which_stream": ("i64*",), "fail_with": ("i32",)}, name="probe")
    kernel.build(config)
    return kernel


def _reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * torch.sigmoid(x) * scale


def test_arch_is_read_from_the_device():
    major, minor = torch.cuda.get_device_capability()
    expected = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    assert detect_arch(RuntimeConfig()) == expected


@pytest.mark.parametrize("shape", [(1,), (3,), (4095,), (4096,), (4097,), (16384 * 3 + 5,), (7, 13, 17), (256, 4096)])
def test_example_matches_pytorch(example, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda") * 4
    y = example.ModelNew(1.5)(x)
    torch.cuda.synchronize()
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, _reference(x, 1.5), atol=1e-5, rtol=1e-5)


def test_example_handles_a_misaligned_view(example):
    base = torch.randn(3 * 4096 + 7, device="cuda")
    x = base[1:]  # contiguous, but 4 bytes past a 16-byte boundary: takes the scalar path
    assert x.data_ptr() % 16 != 0
    torch.testing.assert_close(example.ModelNew(0.5)(x), _reference(x, 0.5), atol=1e-5, rtol=1e-5)


def test_example_handles_an_empty_tensor(example):
    assert example.ModelNew(1.5)(torch.empty(0, device="cuda")).numel() == 0


def test_launch_uses_the_current_stream(probe):
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        probe.which_stream(out)
    side.synchronize()
    assert int(out.item()) == side.cuda_stream
    probe.which_stream(out)
    torch.cuda.synchronize()
    assert int(out.item()) == torch.cuda.current_stream().cuda_stream


def test_nonzero_return_raises_kernel_error_with_the_cuda_name(probe):
    with pytest.raises(KernelError) as info:
        probe.fail_with(1)
    assert info.value.error_name == "cudaErrorInvalidValue" and info.value.code == 1
    assert "invalid argument" in str(info.value)
    probe.fail_with(0)  # the error was returned, not raised on the device: the context is fine


def test_non_contiguous_tensor_is_rejected(example):
    x = torch.randn(64, 32, device="cuda").t()
    with pytest.raises(LaunchError, match=r"non-contiguous .*\.contiguous\(\)"):
        example.kernel.swish_scale(x, torch.empty(32, 64, device="cuda"), x.numel(), 1.0)


def test_first_call_builds_with_the_config_in_use(tmp_path):
    kernel = CuteKernel(PROBE_SOURCE, {"which_stream": ("i64*",), "fail_with": ("i32",)}, name="lazy")
    with use_config(RuntimeConfig(cache_dir=tmp_path / "lazy")):
        kernel.fail_with(0)
    assert kernel.build_result is not None
    assert kernel.build_result.library_path.is_relative_to(tmp_path / "lazy")
