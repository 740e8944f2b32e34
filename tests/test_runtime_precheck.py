"""The check before nvcc: a dim3 that C++ reads as a function declaration is named, with its fix, as
a build error (no compiler runs, so this needs no toolchain)."""

from __future__ import annotations

import pytest

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError
from cutegen.knowledge import pitfalls_for
from cutegen.runtime import build_library
from cutegen.runtime.precheck import vexing_parses

LAUNCHER = """#include <cuda_runtime.h>
__global__ void fill_kernel(float* y) {{ y[blockIdx.x] = 1.0f; }}
extern "C" int fill(float* y, long n, cudaStream_t stream) {{
  {declaration}  // the grid
  fill_kernel<<<grid, 1, 0, stream>>>(y);
  return cudaGetLastError();
}}
"""


@pytest.mark.parametrize("declaration", ["dim3 grid(unsigned(n));", "dim3 const grid(unsigned(n), unsigned(n));",
                                         "dim3 grid(int(n), std::uint32_t(n));", "dim3 grid();",
                                         "dim3 grid(unsigned n);"])
def test_a_dim3_declared_as_a_function_is_a_build_error_before_nvcc(declaration, tmp_path):
    source = LAUNCHER.format(declaration=declaration)
    (found,) = vexing_parses(source)
    assert found.line == 4 and found.name == "grid" and found.fixed.endswith("};")
    config = RuntimeConfig(cache_dir=tmp_path / "cache", nvcc=str(tmp_path / "no-nvcc-here"))
    with pytest.raises(BuildError) as err:  # raised before the (missing) compiler is looked for
        build_library(source, config)
    distilled = err.value.distilled
    assert distilled.startswith("kernel.cu:4: error:") and "most vexing parse" in distilled
    assert f"Fix: brace-initialize: `{found.fixed}`" in distilled
    assert pitfalls_for(distilled).startswith("### Most vexing parse of a dim3")  # the repair prompt's entry


@pytest.mark.parametrize("declaration", ["dim3 grid{unsigned(n)};", "dim3 grid(n);", "dim3 grid((n + 1) / 2);",
                                         "dim3 grid(static_cast<unsigned>(n));", "dim3 grid(unsigned(n), 1);",
                                         "dim3 const grid = dim3(unsigned(n));"])
def test_variables_are_left_alone(declaration):
    assert vexing_parses(LAUNCHER.format(declaration=declaration)) == []


def test_a_declaration_no_launch_uses_compiles_and_is_left_alone():
    unused = "dim3 spare(unsigned(n));\n  dim3 grid{unsigned(n)};"
    assert vexing_parses(LAUNCHER.format(declaration=unused)) == []
    commented = "// dim3 grid(unsigned(n)); would declare a function\n  dim3 grid{unsigned(n)};"
    assert vexing_parses(LAUNCHER.format(declaration=commented)) == []
