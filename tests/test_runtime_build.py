"""cutegen.runtime.build: toolchain discovery, flags, the content-addressed cache, nvcc errors.

Tests marked nvcc compile for sm_90a without a GPU (compile-only) and skip when nvcc or the CUTLASS
headers are missing. The tiny CUDA source keeps them fast (under a second per build on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError, ConfigError, ToolchainError
from cutegen.runtime import (
    build_key,
    build_library,
    cache_key,
    detect_arch,
    find_cutlass_include,
    find_nvcc,
    normalize_arch,
    nvcc_flags,
    nvcc_release,
    nvcc_version,
)
from cutegen.runtime.build import headers_id

from helpers import needs_nvcc

TINY_SOURCE = """\
#include <cuda_runtime.h>
__global__ void add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
extern "C" int add_one_launch(float* x, int n, cudaStream_t stream) {
  if (n > 0) add_one<<<(n + 255) / 256, 256, 0, stream>>>(x, n);
  return cudaGetLastError();
}
"""

# A CuTe mistake on line 7: a rank-2 tiler for a rank-1 tensor fails deep inside cute/layout.hpp.
CUTE_ERROR_SOURCE = """\
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
using namespace cute;

__global__ void bad(float* x, int n) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_shape(n));                   // (N)
  Tensor gX = local_tile(mX, Shape<_128, _4>{}, make_coord(blockIdx.x));      // (TILE) wrong rank
  gX(threadIdx.x) = 0.0f;
}
extern "C" int bad_launch(float* x, int n, cudaStream_t stream) {
  bad<<<1, 128, 0, stream>>>(x, n);
  return cudaGetLastError();
}
"""


def _config(tmp_path: Path, **kw) -> RuntimeConfig:
    return RuntimeConfig(cache_dir=tmp_path / "cache", arch=kw.pop("arch", "sm_90a"), **kw)


# ------------------------------------------------------------------------------- toolchain errors


def test_nvcc_setting_that_does_not_exist_is_a_toolchain_error(tmp_path):
    with pytest.raises(ToolchainError) as info:
        find_nvcc(RuntimeConfig(nvcc=str(tmp_path / "bin" / "nvcc")))
    message = str(info.value)
    assert str(tmp_path / "bin" / "nvcc") in message
    assert "CUTEGEN_NVCC" in message and "Fix:" in message


def test_nvcc_setting_that_is_not_executable_is_a_toolchain_error(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("not a program")
    fake.chmod(0o644)
    with pytest.raises(ToolchainError, match="not executable"):
        find_nvcc(RuntimeConfig(nvcc=str(fake)))


def test_build_with_missing_nvcc_fails_before_compiling(tmp_path):
    with pytest.raises(ToolchainError, match="does not exist"):
        build_library(TINY_SOURCE, _config(tmp_path, nvcc=str(tmp_path / "nvcc")))
    assert not (tmp_path / "cache").exists()


def test_cutlass_include_without_headers_is_a_toolchain_error(tmp_path):
    (tmp_path / "include").mkdir()
    with pytest.raises(ToolchainError) as info:
        find_cutlass_include(RuntimeConfig(cutlass_include=tmp_path))
    message = str(info.value)
    assert str(tmp_path) in message and "cute/tensor.hpp" in message
    assert "CUTEGEN_CUTLASS_INCLUDE" in message and "nvidia-cutlass" in message


def test_cutlass_checkout_root_or_include_folder_both_work(tmp_path):
    include = tmp_path / "include"
    (include / "cute").mkdir(parents=True)
    (include / "cutlass").mkdir()
    (include / "cute" / "tensor.hpp").write_text("")
    (include / "cutlass" / "cutlass.h").write_text("")
    assert find_cutlass_include(RuntimeConfig(cutlass_include=tmp_path)) == include.resolve()
    assert find_cutlass_include(RuntimeConfig(cutlass_include=include)) == include.resolve()


def test_detect_arch_without_gpu_or_setting_says_how_to_compile_anyway():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the arch is read from it")
    with pytest.raises(ToolchainError, match="CUTEGEN_ARCH"):
        detect_arch(RuntimeConfig())


# ---------------------------------------------------------------------------------- arch and flags


@pytest.mark.parametrize(
    ("given", "expected"),
    [("sm_90", "sm_90a"), ("sm_90a", "sm_90a"), ("sm_80", "sm_80"), ("sm_100a", "sm_100a"), (" sm_89 ", "sm_89")],
)
def test_normalize_arch(given, expected):
    assert normalize_arch(given) == expected


@pytest.mark.parametrize("bad", ["90", "compute_90", "sm90", "sm_9", "sm_90x", ""])
def test_bad_arch_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="sm_90a"):
        normalize_arch(bad)


def test_nvcc_flags_for_hopper_target_the_arch_specific_sm_90a():
    assert nvcc_flags("sm_90", Path("/inc")) == [
        "-std=c++17", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-shared", "-Xcompiler", "-fPIC", "--cudart=static", "-I", "/inc",
    ]


def test_nvcc_flags_for_other_archs_are_plain_and_take_extras():
    flags = nvcc_flags("sm_80", extra=("-lineinfo",))
    assert "-gencode=arch=compute_80,code=sm_80" in flags
    assert flags[-1] == "-lineinfo" and "-I" not in flags


def test_nvcc_release_parses_the_version_banner():
    banner = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0"
    assert nvcc_release(banner) == "13.0.88"


def test_cache_key_changes_with_each_input():
    base = ("src", ["-O3"], "sm_90a", "V13.0.88", "hdr")
    keys = {
        cache_key(*base),
        cache_key("src2", *base[1:]),
        cache_key(base[0], ["-O2"], *base[2:]),
        cache_key(*base[:2], "sm_80", *base[3:]),
        cache_key(*base[:3], "V12.8.1", base[4]),
        cache_key(*base[:4], "hdr2"),
    }
    assert len(keys) == 6
    assert cache_key(*base) == cache_key(*base)
    assert len(cache_key(*base)) == 64


def test_the_build_key_holds_content_only():
    """build_key takes no path: the flags it keys are nvcc_flags without the include folder, so the
    key is the same in every virtual environment; each content input still changes it."""
    version = "Cuda compilation tools, release 13.0, V13.0.88"
    key = build_key(TINY_SOURCE, "sm_90a", version, "hdr")
    assert key == cache_key(TINY_SOURCE.rstrip("\n") + "\n" + build_footer(), nvcc_flags("sm_90a"), "sm_90a", version,
                            "hdr")
    assert key == build_key(TINY_SOURCE, "sm_90", version, "hdr")  # sm_90 is built as sm_90a
    assert len({key, build_key(TINY_SOURCE + "//\n", "sm_90a", version, "hdr"),
                build_key(TINY_SOURCE, "sm_80", version, "hdr"), build_key(TINY_SOURCE, "sm_90a", "V12.8", "hdr"),
                build_key(TINY_SOURCE, "sm_90a", version, "hdr2"),
                build_key(TINY_SOURCE, "sm_90a", version, "hdr", ("-lineinfo",))}) == 6


def build_footer() -> str:
    from cutegen.runtime.build import runtime_source

    return runtime_source("")[1:]


# ------------------------------------------------------------------------------------ cache (nvcc)


@pytest.mark.nvcc
@needs_nvcc
def test_second_build_is_a_cache_hit(tmp_path):
    config = _config(tmp_path)
    first = build_library(TINY_SOURCE, config)
    assert not first.cached and first.compile_s is not None and first.compile_s > 0
    assert first.arch == "sm_90a" and first.library_path.is_file()
    entry = first.library_path.parent
    assert {p.name for p in entry.iterdir()} == {"kernel.so", "kernel.cu", "build.log", "build.json"}
    assert json.loads((entry / "build.json").read_text())["returncode"] == 0
    assert "cutegen_error_string" in (entry / "kernel.cu").read_text()
    second = build_library(TINY_SOURCE, config)
    assert second.cached and second.compile_s is None
    assert second.library_path == first.library_path and second.cache_key == first.cache_key
    assert not any((tmp_path / "cache" / "tmp").iterdir())  # no temporary folder left behind


def install_root(root: Path, headers: Path) -> Path:
    """An include folder at `root` holding the CUTLASS headers of `headers` (linked, not copied: the
    same content at another path, as in another virtual environment or on another machine)."""
    include = root / "site-packages" / "cutlass_library" / "source" / "include"
    include.mkdir(parents=True)
    for name in ("cute", "cutlass"):
        (include / name).symlink_to(headers / name, target_is_directory=True)
    return include


@pytest.mark.nvcc
@needs_nvcc
def test_a_build_from_another_install_root_is_found_by_content(tmp_path):
    """The split run's case: the CPU side builds with its headers at one path, the GPU side looks the
    build up with the same headers at another; the key holds no path, so the second is a cache hit."""
    headers = find_cutlass_include(RuntimeConfig())
    roots = [install_root(tmp_path / name, headers) for name in ("cpu-side-venv", "gpu-side")]
    source = "#include <cutlass/version.h>\n" + TINY_SOURCE  # found only through the -I folder
    first = build_library(source, _config(tmp_path, cutlass_include=roots[0]))
    second = build_library(source, _config(tmp_path, cutlass_include=roots[1]))
    assert not first.cached and second.cached and second.library_path == first.library_path
    version = nvcc_version(find_nvcc(RuntimeConfig()))
    assert first.cache_key == build_key(source, "sm_90", version, headers_id(headers))
    command = json.loads((first.library_path.parent / "build.json").read_text())["command"]
    assert str(roots[0]) in command  # the build used the first root's headers; the key does not name them
    # Other headers at the same path are another build: a changed cutlass/version.h changes the key.
    other = tmp_path / "patched" / "include"
    (other / "cutlass").mkdir(parents=True)
    (other / "cute").symlink_to(headers / "cute", target_is_directory=True)
    for entry in (headers / "cutlass").iterdir():
        if entry.name != "version.h":
            (other / "cutlass" / entry.name).symlink_to(entry)
    (other / "cutlass" / "version.h").write_text((headers / "cutlass" / "version.h").read_text() + "// patched\n")
    assert headers_id(other) != headers_id(headers)
    assert build_key(source, "sm_90a", version, headers_id(other)) != first.cache_key


@pytest.mark.nvcc
@needs_nvcc
def test_flags_arch_and_source_each_give_a_new_build(tmp_path):
    base = build_library(TINY_SOURCE, _config(tmp_path))
    variants = [
        build_library(TINY_SOURCE, _config(tmp_path, extra_flags=("-lineinfo",))),
        build_library(TINY_SOURCE, _config(tmp_path, arch="sm_80")),
        build_library(TINY_SOURCE + "// changed\n", _config(tmp_path)),
    ]
    assert all(not v.cached for v in variants)
    assert len({base.cache_key, *(v.cache_key for v in variants)}) == 4
    assert variants[1].arch == "sm_80"


_CONCURRENT_BUILD = """
import json, sys, time
from pathlib import Path
from cutegen.config import RuntimeConfig
from cutegen.runtime import build_library
source, cache, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < start_at:  # all processes reach build_library at the same moment
    time.sleep(0.001)
r = build_library(source, RuntimeConfig(cache_dir=Path(cache), arch="sm_90a"))
print(json.dumps({"cached": r.cached, "path": str(r.library_path)}))
"""


@pytest.mark.nvcc
@needs_nvcc
def test_concurrent_builds_of_one_key_compile_once(tmp_path):
    start_at = time.time() + 2.0  # after every interpreter has started
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT_BUILD, TINY_SOURCE, str(tmp_path / "cache"), str(start_at)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(3)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(r["cached"] for r in results) == [False, True, True]
    assert len({r["path"] for r in results}) == 1


# ------------------------------------------------------------------------------- build errors (nvcc)


@pytest.mark.nvcc
@needs_nvcc
def test_cute_compile_error_is_distilled_to_the_offending_line(tmp_path):
    with pytest.raises(BuildError) as info:
        build_library(CUTE_ERROR_SOURCE, _config(tmp_path))
    err = info.value
    raw_log = next((tmp_path / "cache").glob("*/*/build.log")).read_text()
    assert "kernel.cu:7: error: static assertion failed" in err.distilled
    assert "Too many modes in tiler" in err.distilled
    assert "local_tile(mX, Shape<_128, _4>{}" in err.distilled  # the source line itself
    assert "cute/layout.hpp" in err.distilled and "site-packages" not in err.distilled
    assert len(err.distilled) <= 1500 < len(raw_log)
    assert err.distilled in str(err) and "build.log" in str(err)
    assert not list((tmp_path / "cache").glob("*/*/kernel.so"))  # failures are not cached


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_timeout_kills_the_compiler_and_says_so(tmp_path):
    started = time.perf_counter()
    with pytest.raises(BuildError, match="did not finish within 0.5 s") as info:
        build_library(CUTE_ERROR_SOURCE, _config(tmp_path, nvcc_timeout_s=0.5))
    assert time.perf_counter() - started < 10
    assert "timed out" in info.value.distilled
    assert not any((tmp_path / "cache" / "tmp").iterdir())


@pytest.mark.nvcc
@needs_nvcc
def test_unwritable_cache_folder_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache folder should be: fails even for root
    with pytest.raises(ConfigError, match="CUTEGEN_CACHE"):
        build_library(TINY_SOURCE, RuntimeConfig(cache_dir=blocker / "cache", arch="sm_90a"))
