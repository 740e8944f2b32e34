"""cutegen.runtime: compile CuTe C++ source with nvcc into a shared library and call its launchers.

    from cutegen.runtime import CuteKernel, use_config

    kernel = CuteKernel(SOURCE, {"swish_scale": ("f32*", "f32*", "i64", "f32")})
    kernel.swish_scale(x, y, x.numel(), 1.5)   # builds (or loads from the cache) on first call

build.py compiles and caches, launch.py declares and calls (its docstring is the launcher contract),
distill.py shortens compiler errors, signature.py checks declarations against the C source.
Importing this package imports neither torch nor any compiler.
"""

from cutegen.runtime.build import (
    build_key,
    build_library,
    cache_key,
    check_compiles,
    check_key,
    detect_arch,
    find_cutlass_include,
    find_nvcc,
    library_key,
    normalize_arch,
    nvcc_flags,
    nvcc_release,
    nvcc_version,
)
from cutegen.runtime.distill import distill_errors
from cutegen.runtime.launch import CuteKernel, KernelError, Launcher, current_config, find_kernels, use_config

__all__ = [
    "CuteKernel",
    "KernelError",
    "Launcher",
    "build_key",
    "build_library",
    "cache_key",
    "check_compiles",
    "check_key",
    "current_config",
    "detect_arch",
    "distill_errors",
    "find_cutlass_include",
    "find_kernels",
    "find_nvcc",
    "library_key",
    "normalize_arch",
    "nvcc_flags",
    "nvcc_release",
    "nvcc_version",
    "use_config",
]
