"""cutegen.runtime.launch on a machine without a GPU: declarations, argument checks, loading.

The library links the CUDA runtime statically, so it can be built for sm_90a and dlopen-ed here;
every argument check runs before anything touches CUDA, so the errors are testable on a CPU.
"""

from __future__ import annotations

import threading
import types

import pytest

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError, ConfigError, LaunchError
from cutegen.runtime import (
    CuteKernel,
    KernelError,
    current_config,
    find_kernels,
    use_config,
)
from cutegen.runtime.distill import distill_errors

from helpers import needs_nvcc, toolchain_problem

torch = pytest.importorskip("torch")

SOURCE = """\
#include <cuda_runtime.h>
#include <cstdint>
__global__ void scale_kernel(float* x, int64_t n, float a) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= a;
}
extern "C" int scale(float* x, int64_t n, float a, cudaStream_t stream) {
  if (n > 0) scale_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, n, a);
  return cudaGetLastError();
}
extern "C" int fail_with(int code, cudaStream_t stream) { return code; }
extern "C" int scalars(int64_t n, float a, double b, cudaStream_t stream) {
  return n == 1 && a == 2.0f && b == 3.0 ? 0 : 1;
}
"""
FUNCTIONS = {"scale": ("f32*", "i64", "f32"), "fail_with": ("i32",), "scalars": ("i64", "f32", "f64")}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> CuteKernel:
    if toolchain_problem() is not None:
        pytest.skip("nvcc or the CUTLASS headers are missing")
    kernel = CuteKernel(SOURCE, FUNCTIONS, name="test_scale")
    kernel.build(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), arch="sm_90a"))
    return kernel


# ------------------------------------------------------------------------------------- declaration


def test_declaring_compiles_nothing_and_exposes_launchers():
    kernel = CuteKernel(SOURCE, FUNCTIONS)
    assert kernel.build_result is None
    assert kernel.scale.codes == ("f32*", "i64", "f32")
    assert kernel.scale.param_names == ["x", "n", "a", "stream"]
    with pytest.raises(AttributeError, match="declared: scale, fail_with, scalars"):
        kernel.scael  # noqa: B018


@pytest.mark.parametrize(
    ("functions", "expected"),
    [
        ({"scale": ("f32*", "int64", "f32")}, "unknown type code 'int64'"),
        ({"scale": ("f32*", "i64")}, "takes 4 parameters in the source but 2"),
        ({"scale": ("f32*", "i32", "f32")}, "does not match the C type of `int64_t n`"),
        ({"scale": ("f32", "i64", "f32")}, "declares a scalar"),
        ({"scale": ("f64*", "i64", "f32")}, "does not match the C type of `float* x`"),
        ({"scale": ("f32*", "i64", "f32", "i32")}, "takes 4 parameters"),
        ({"build": ("i32",)}, "clashes with a CuteKernel attribute"),
        ({"not-a-name": ("i32",)}, "not a C identifier"),
        ({}, "declares no launchers"),
        ({"fail_with": "i32"}, "must be a tuple of strings"),
    ],
)
def test_bad_declarations_are_config_errors(functions, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace("*", r"\*")):
        CuteKernel(SOURCE, functions)


def test_launcher_without_stream_parameter_is_rejected():
    source = 'extern "C" int f(float* x, int n) { return 0; }'
    with pytest.raises(ConfigError, match="not a cudaStream_t"):
        CuteKernel(source, {"f": ("f32*",)})


def test_undeclared_c_types_are_not_judged():
    source = 'extern "C" int f(my_vec_t* x, Params p, cudaStream_t s) { return 0; }'
    assert CuteKernel(source, {"f": ("f32*", "i64")}).f.param_names == ["x", "p", "s"]


def test_find_kernels_returns_each_kernel_once_in_order():
    module = types.ModuleType("candidate")
    first, second = CuteKernel(SOURCE, FUNCTIONS, "a"), CuteKernel(SOURCE, FUNCTIONS, "b")
    module.first, module.alias, module.second, module.other = first, first, second, 3
    assert find_kernels(module) == [first, second]


def test_use_config_nests_and_is_per_thread(tmp_path):
    outer, inner = RuntimeConfig(cache_dir=tmp_path / "a"), RuntimeConfig(cache_dir=tmp_path / "b")
    assert current_config() == RuntimeConfig()
    seen_in_thread = []
    with use_config(outer):
        with use_config(inner):
            assert current_config() is inner
            thread = threading.Thread(target=lambda: seen_in_thread.append(current_config()))
            thread.start()
            thread.join()
        assert current_config() is outer
    assert current_config() == RuntimeConfig()
    assert seen_in_thread == [RuntimeConfig()]  # a new thread starts from the default


# ------------------------------------------------------------------------------- argument checks


@needs_nvcc
def test_library_loads_without_a_gpu_and_knows_cuda_error_names(built):
    assert built.build_result is not None and built.build_result.arch == "sm_90a"
    assert built.error_text(2) == ("cudaErrorMemoryAllocation", "out of memory")
    assert built.error_text(0)[0] == "cudaSuccess"


@needs_nvcc
def test_cpu_tensor_is_rejected_with_the_fix(built):
    with pytest.raises(LaunchError) as info:
        built.scale(torch.ones(8), 8, 2.0)
    message = str(info.value)
    assert "argument 0 (x) of launcher scale" in message
    assert "CUDA tensor" in message and "on CPU" in message and ".cuda()" in message


@needs_nvcc
def test_wrong_dtype_is_rejected_naming_both_dtypes(built):
    with pytest.raises(LaunchError) as info:
        built.scale(torch.ones(8, dtype=torch.float64), 8, 2.0)
    message = str(info.value)
    assert "torch.float32" in message and "float64 tensor" in message and ".to(torch.float32)" in message


@needs_nvcc
def test_wrong_argument_count_is_rejected(built):
    with pytest.raises(LaunchError, match=r"takes 3 arguments \(f32\*, i64, f32\) but was called with 2"):
        built.scale(torch.ones(8), 8)


@needs_nvcc
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((7, 8, 2.0), "must be a torch.float32 CUDA tensor, but was given int 7"),
        ((None, 8, 2.0), "but was given NoneType None"),
    ],
)
def test_non_tensor_for_a_tensor_argument(built, args, expected):
    with pytest.raises(LaunchError, match=expected):
        built.scale(*args)


@needs_nvcc
@pytest.mark.parametrize(
    ("launcher", "args", "expected"),
    [
        ("fail_with", (2**31,), r"argument 0 \(code\) of launcher fail_with is declared 'i32' and needs an integer"),
        ("fail_with", (1.5,), "needs an integer"),
        ("fail_with", (torch.tensor(3),), r"\.item\(\)"),
        ("scalars", (1, "2.0", 3.0), r"argument 1 \(a\) .* needs a real number, but was given str"),
        ("scalars", (-(2**63) - 1, 2.0, 3.0), r"needs an integer in \[-9223372036854775808"),
    ],
)
def test_bad_scalars_are_rejected(built, launcher, args, expected):
    with pytest.raises(LaunchError, match=expected):
        getattr(built, launcher)(*args)


def test_argument_errors_come_before_any_build(tmp_path):
    kernel = CuteKernel(SOURCE, FUNCTIONS)
    with use_config(RuntimeConfig(cache_dir=tmp_path / "cache", arch="sm_90a")):
        with pytest.raises(LaunchError):
            kernel.scale(torch.ones(8), 8, 2.0)
    assert kernel.build_result is None and not (tmp_path / "cache").exists()


@needs_nvcc
def test_valid_arguments_without_a_gpu_fail_clearly(built):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(LaunchError, match="needs a CUDA device"):
        built.fail_with(0)


@needs_nvcc
def test_missing_extern_c_launcher_is_a_build_error(tmp_path):
    source = "#include <cuda_runtime.h>\nint hidden(int code, cudaStream_t s) { return code; }\n"
    kernel = CuteKernel(source, {"hidden": ("i32",)})
    with pytest.raises(BuildError, match='extern "C"'):
        kernel.build(RuntimeConfig(cache_dir=tmp_path, arch="sm_90a"))


def test_kernel_error_message_names_the_cuda_error_and_a_fix():
    err = KernelError("swish", 9, "cudaErrorInvalidConfiguration", "invalid configuration argument")
    assert isinstance(err, RuntimeError)
    assert "Launcher swish returned CUDA error 9 (cudaErrorInvalidConfiguration" in str(err)
    assert "1024 threads per block" in str(err)


# ------------------------------------------------------------------------------ distill (no nvcc)

_EDG_LOG = """\
kernel.cu(6): error: static assertion failed with "N must be a multiple of 4"
    static_assert(N % 4 == 0, "N must be a multiple of 4");
    ^
          detected during instantiation of "void f<N>(float *) [with N=6]" at line 10

1 error detected in the compilation of "kernel.cu".
"""
_EDG_SOURCE = "\n".join(
    [f"// line {i}" for i in range(1, 6)]
    + ['  static_assert(N % 4 == 0, "N must be a multiple of 4");', "//", "//", "//"]
    + ["__global__ void g(float* x) { f<6>(x); }"]
)


def test_distill_shows_error_line_and_instantiation_site():
    text = distill_errors(_EDG_LOG, _EDG_SOURCE)
    assert text.splitlines() == [
        'kernel.cu:6: error: static assertion failed with "N must be a multiple of 4"',
        '  6 | static_assert(N % 4 == 0, "N must be a multiple of 4");',
        "  instantiated from kernel.cu:10 | __global__ void g(float* x) { f<6>(x); }",
    ]


def test_distill_keeps_device_backend_errors():
    log = "ptxas error   : Entry function '_Z1gPf' uses too much shared data (0x61a80 bytes, 0x38c00 max)\n"
    expected = "error: ptxas: Entry function '_Z1gPf' uses too much shared data (0x61a80 bytes, 0x38c00 max)"
    assert distill_errors(log, "") == expected


def test_distill_of_unrecognised_log_is_its_tail():
    log = "\n".join(f"line {i}" for i in range(40)) + "\nSegmentation fault (core dumped)"
    text = distill_errors(log, "")
    assert text.endswith("Segmentation fault (core dumped)") and "line 10" not in text


def test_distill_shortens_paths_and_template_arguments():
    long_with = "[with T=" + "cute::tuple<cute::_1, cute::_2>, " * 40 + "]"
    log = (
        "/opt/venv/lib/site-packages/cutlass_library/source/include/cute/layout.hpp(99):"
        f" error: no instance {long_with}\n"
        f'          detected during:\n            instantiation of "auto f() {long_with}" at line 3 of kernel.cu\n\n'
    )
    text = distill_errors(log, "a\nb\nTensor t = oops();\n")
    assert text.startswith("kernel.cu:3: error: no instance [with ...] [in cute/layout.hpp:99")
    assert "3 | Tensor t = oops();" in text and "site-packages" not in text and len(text) < 300


def test_distill_stays_short_for_many_errors():
    log = "".join(f'kernel.cu({i}): error: identifier "v{i}" is undefined\n  x\n  ^\n\n' for i in range(1, 300))
    source = "\n".join(f"int a{i} = v{i};" for i in range(1, 300))
    text = distill_errors(log, source)
    assert len(text) <= 1500 and text.startswith('kernel.cu:1: error: identifier "v1" is undefined')
    assert "299 errors in total" in text

