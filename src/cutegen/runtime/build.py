"""Compile CuTe C++ source into a shared library with nvcc, through a content-addressed cache.

Why not `torch.utils.cpp_extension.load_inline`: including the PyTorch headers costs about a minute
per build, while the same CuTe code as a plain nvcc shared library builds in seconds. The library
has `extern "C"` launchers only, links the CUDA runtime statically (so it depends on nothing but
libc/libstdc++ and loads on a machine without a GPU), and is called through ctypes (see launch.py).

Cache protocol: the key is sha256 of (full source, nvcc flags, arch, `nvcc --version` output, an id
of the CUTLASS headers), all content (`build_key`): the flags are those of `nvcc_flags` without the
include folder, whose absolute path differs between virtual environments, machines and cluster
nodes, and the headers enter through the hash of their cutlass/version.h instead. So a build made
on a machine without a GPU (`cutegen prebuild`) is found by a GPU machine that installed the same
toolkit and headers anywhere else, given the same cache folder (copied or shared). A
`shared_cache_dir` is looked up first and never written (a candidate's worker reads the evaluator's
cache and builds what it lacks in its own folder). An entry is the folder `<cache_dir>/<key[:2]>/<key>/` holding kernel.cu,
build.log, build.json and kernel.so; kernel.so is moved in last with an atomic os.replace, so its
presence means the entry is complete and a reader needs no lock. A builder takes an fcntl lock on
`<key>.lock` first and looks again after getting it, so when several processes build the same key at
once only the first runs nvcc and the others load its result. nvcc runs in a private temporary
folder (TMPDIR too, so its intermediates go away with it), in its own process group, and the whole
group is killed when it exceeds `nvcc_timeout_s`.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError, ConfigError, ToolchainError
from cutegen.records import BuildResult
from cutegen.runtime.distill import distill_errors
from cutegen.runtime.precheck import precheck

SOURCE_NAME = "kernel.cu"
LIBRARY_NAME = "kernel.so"
LOG_NAME = "build.log"
NVCC_FALLBACK = Path("/usr/local/cuda/bin/nvcc")
_ARCH = re.compile(r"^sm_(\d{2,3})([af]?)$")
_RELEASE = re.compile(r"\bV(\d+\.\d+(?:\.\d+)?)")
_LOG_HEAD_BYTES = 256 * 1024  # plenty for the first errors; template spew beyond it is noise
_LOG_TAIL_CHARS = 4000

__all__ = [
    "build_key",
    "build_library",
    "cache_key",
    "detect_arch",
    "distill_errors",
    "find_cutlass_include",
    "find_nvcc",
    "headers_id",
    "normalize_arch",
    "nvcc_flags",
    "nvcc_release",
    "nvcc_version",
]


# ------------------------------------------------------------------------------------ toolchain


def find_nvcc(config: RuntimeConfig) -> str:
    """The nvcc to run: `config.nvcc` (a path or a name on PATH), else PATH, else /usr/local/cuda/bin."""
    if config.nvcc:
        found = shutil.which(config.nvcc)
        if found is None:
            raise ToolchainError(
                f"The nvcc set in the runtime settings ({config.nvcc}) does not exist or is not executable.",
                "Point CUTEGEN_NVCC (RuntimeConfig.nvcc) at the nvcc binary of a CUDA 12.3+ toolkit, or"
                " unset it to search PATH and /usr/local/cuda/bin.",
            )
        return found
    found = shutil.which("nvcc")
    if found is None and NVCC_FALLBACK.is_file() and os.access(NVCC_FALLBACK, os.X_OK):
        found = str(NVCC_FALLBACK)
    if found is None:
        raise ToolchainError(
            f"nvcc, the CUDA compiler, was not found on PATH or at {NVCC_FALLBACK}.",
            "Install the CUDA toolkit (12.3 or newer for sm_90a), put its bin/ folder on PATH, or set"
            " CUTEGEN_NVCC (RuntimeConfig.nvcc) to the nvcc binary.",
        )
    return found


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """`nvcc --version` output (part of the cache key), probed once per nvcc path per process."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ToolchainError(f"nvcc at {nvcc} could not be run: {err}.", "Check the CUDA toolkit install.") from None
    if proc.returncode != 0 or "Cuda compilation tools" not in proc.stdout:
        raise ToolchainError(
            f"`{nvcc} --version` failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[:300]}",
            "Check the CUDA toolkit install, or point CUTEGEN_NVCC (RuntimeConfig.nvcc) at a working nvcc.",
        )
    return proc.stdout.strip()


def nvcc_release(version_output: str) -> str:
    """'13.0.88' from `nvcc --version` output (the whole text when the pattern is missing)."""
    match = _RELEASE.search(version_output)
    return match.group(1) if match else version_output.strip().splitlines()[-1]


def _has_headers(include: Path) -> bool:
    return (include / "cute" / "tensor.hpp").is_file() and (include / "cutlass" / "cutlass.h").is_file()


def find_cutlass_include(config: RuntimeConfig) -> Path:
    """The folder holding cute/ and cutlass/: `config.cutlass_include` (an include/ folder or a checkout
    root), else the headers shipped in the nvidia-cutlass wheel (found without importing it)."""
    if config.cutlass_include is not None:
        root = Path(config.cutlass_include).expanduser()
        for candidate in (root, root / "include"):
            if _has_headers(candidate):
                return candidate.resolve()
        raise ToolchainError(
            f"The CUTLASS include folder set in the runtime settings ({root}) has no cute/tensor.hpp and"
            " cutlass/cutlass.h.",
            "Set CUTEGEN_CUTLASS_INCLUDE (RuntimeConfig.cutlass_include) to the include/ folder of a CUTLASS"
            " 3.5+ checkout, or unset it to use the headers of the nvidia-cutlass package.",
        )
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError(
            "The CUTLASS/CuTe headers were not found: the nvidia-cutlass package is not installed and no"
            " CUTLASS include folder is set.",
            "Install the headers with `pip install nvidia-cutlass==4.2.0.0`, or set CUTEGEN_CUTLASS_INCLUDE"
            " (RuntimeConfig.cutlass_include) to the include/ folder of a CUTLASS checkout.",
        )
    include = Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
    if not _has_headers(include):
        raise ToolchainError(
            f"The installed nvidia-cutlass package has no CuTe headers under {include}.",
            "Reinstall it with `pip install --force-reinstall nvidia-cutlass==4.2.0.0`, or set"
            " CUTEGEN_CUTLASS_INCLUDE to the include/ folder of a CUTLASS checkout.",
        )
    return include


@functools.lru_cache(maxsize=None)
def headers_id(include: Path) -> str:
    """Identifies the CUTLASS release behind `include` by content (the hash of its cutlass/version.h,
    wherever it is installed), so upgrading the headers in place rebuilds."""
    version_h = include / "cutlass" / "version.h"
    return hashlib.sha256(version_h.read_bytes()).hexdigest()[:16] if version_h.is_file() else "unknown"


def normalize_arch(arch: str) -> str:
    """Check an arch string; sm_90 becomes sm_90a, because wgmma and TMA only exist in the arch-specific
    target and plain sm_90 compiles them away without a word."""
    match = _ARCH.match(arch.strip())
    if match is None:
        raise ConfigError(
            f"The GPU architecture {arch!r} is not of the form sm_XY (optionally ending in a or f).",
            "Use the compute capability of the target GPU, e.g. sm_90a for H100/H200, sm_80 for A100.",
        )
    number, suffix = match.groups()
    return f"sm_{number}{suffix or ('a' if number == '90' else '')}"


def detect_arch(config: RuntimeConfig) -> str:
    """`config.arch`, else the current CUDA device's compute capability ("sm_90a" on H100/H200)."""
    if config.arch:
        return normalize_arch(config.arch)
    try:
        import torch  # lazy: loading torch takes seconds
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is None or not torch.cuda.is_available():
        raise ToolchainError(
            "No CUDA device is visible to read the GPU architecture from, and no architecture is set.",
            "Run on a machine with a GPU, or set CUTEGEN_ARCH (RuntimeConfig.arch), e.g. sm_90a for"
            " H100/H200, to compile without one.",
        )
    major, minor = torch.cuda.get_device_capability()
    return normalize_arch(f"sm_{major}{minor}")


def nvcc_flags(arch: str, include: Path | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The nvcc command-line flags for a shared library of `extern "C"` launchers for `arch`."""
    number = normalize_arch(arch)[len("sm_") :]
    flags = [
        "-std=c++17",
        "--expt-relaxed-constexpr",  # CuTe calls constexpr host functions from device code
        "-O3",
        "-DNDEBUG",
        f"-gencode=arch=compute_{number},code=sm_{number}",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "--cudart=static",  # the library then needs no libcudart.so at load time
    ]
    if include is not None:
        flags += ["-I", str(include)]
    return flags + list(extra)


# ---------------------------------------------------------------------------------------- cache


@functools.lru_cache(maxsize=1)
def _footer() -> str:
    return resources.files("cutegen.runtime").joinpath("error_string.h").read_text(encoding="utf-8")


def runtime_source(source: str) -> str:
    """The source as compiled: the candidate's text, then the runtime's error-string helpers (after it,
    so the candidate's line numbers are unchanged in compiler messages)."""
    return source.rstrip("\n") + "\n" + _footer()


def cache_key(source: str, flags: Sequence[str], arch: str, nvcc_version_output: str, headers: str = "") -> str:
    payload = json.dumps([source, list(flags), arch, nvcc_version_output, headers])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def build_key(source: str, arch: str, nvcc_version_output: str, headers: str, extra: Sequence[str] = ()) -> str:
    """The cache key of a build of the candidate's `source` (the runtime's footer is added here): its
    content, the flags without the include folder, the arch, the toolkit and the headers' id. No path
    of this machine enters it, so another machine's or virtual environment's build is found (the
    module docstring). `extra` flags enter as given."""
    arch = normalize_arch(arch)
    return cache_key(runtime_source(source), nvcc_flags(arch, None, extra), arch, nvcc_version_output, headers)


def _cached(entry: Path, key: str, arch: str, version: str, output: str = LIBRARY_NAME) -> BuildResult | None:
    found = entry / output
    if not found.is_file():
        return None
    return BuildResult(found, key, arch, nvcc_release(version), cached=True, compile_s=None)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock on `path`, released when the descriptor closes (also if we crash)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_library(source: str, config: RuntimeConfig) -> BuildResult:
    """Compile `source` (or find it in the cache) into a shared library; see the module docstring.

    Raises ToolchainError (nvcc, headers or arch missing), ConfigError (bad arch or cache folder) or
    BuildError (nvcc rejected the source or timed out, or `precheck` found a mistake nvcc would
    report misleadingly; `distilled` holds the first errors).
    """
    nvcc, include, arch, version = _toolchain(source, config)
    flags = nvcc_flags(arch, include, config.extra_flags)
    key = _library_key(source, include, arch, version, config)
    if config.shared_cache_dir is not None:  # read, never written (a candidate's worker)
        hit = _cached(Path(config.shared_cache_dir).expanduser() / key[:2] / key, key, arch, version)
        if hit is not None:
            return hit
    cache_dir = Path(config.cache_dir).expanduser()
    return _compile_cached(cache_dir, cache_dir / key[:2] / key, key, arch, version, [nvcc, *flags],
                           runtime_source(source), config.nvcc_timeout_s, LIBRARY_NAME)


def library_key(source: str, config: RuntimeConfig) -> str:
    """The cache key `build_library` gives `source` under `config`, without compiling (`build_key`)."""
    _, include, arch, version = _toolchain(source, config)
    return _library_key(source, include, arch, version, config)


def _library_key(source: str, include: Path, arch: str, version: str, config: RuntimeConfig) -> str:
    return build_key(source, arch, version, headers_id(include), config.extra_flags)


def _toolchain(source: str, config: RuntimeConfig) -> tuple[str, Path, str, str]:
    """nvcc, the CUTLASS include folder, the arch and nvcc's version, once `precheck` has named any
    mistake nvcc would report misleadingly."""
    precheck(source, SOURCE_NAME)
    nvcc = find_nvcc(config)
    return nvcc, find_cutlass_include(config), detect_arch(config), nvcc_version(nvcc)


def _compile_cached(cache_dir: Path, entry: Path, key: str, arch: str, version: str, command: list[str],
                    full_source: str, timeout_s: float, output: str) -> BuildResult:
    """`entry`'s `output` from the cache, or compiled into it under a lock per key (a second builder
    waits for the first and finds its result)."""
    hit = _cached(entry, key, arch, version, output)
    if hit is not None:
        return hit
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        (cache_dir / "tmp").mkdir(exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"The build cache folder {cache_dir} cannot be created or written: {err.strerror}.",
            "Set CUTEGEN_CACHE (RuntimeConfig.cache_dir) to a writable folder.",
        ) from None
    with _locked(entry.parent / f"{key}.lock"):
        hit = _cached(entry, key, arch, version, output)  # built by another process while we waited
        if hit is not None:
            return hit
        compile_s = _compile_into(entry, command, full_source, arch, timeout_s, output)
    return BuildResult(entry / output, key, arch, nvcc_release(version), cached=False, compile_s=compile_s)


CUBIN_NAME = "kernel.cubin"
_LIBRARY_ONLY_FLAGS = ("-shared", "-Xcompiler", "-fPIC", "--cudart=static")


def check_compiles(source: str, config: RuntimeConfig) -> BuildResult:
    """Compile only the device code of `source` (nvcc -cubin), into the cache's `checks/` folder: nvcc's
    front end still checks the host code (the launchers) and cicc and ptxas still run for the arch, but
    the host compiler and the link do not, which halves a CuTe build. For a machine that only needs to
    know a source compiles (a CI without a GPU); `library_path` is then the cubin, which nothing loads.
    Weaker than a build: what only the host compiler or the link reports (an `extern "C"` launcher
    declared but not defined) passes here. Raises as `build_library` does."""
    nvcc, include, arch, version = _toolchain(source, config)
    key = _check_key(source, include, arch, version, config)
    cache_dir = Path(config.cache_dir).expanduser()
    return _compile_cached(cache_dir, cache_dir / "checks" / key, key, arch, version,
                           [nvcc, *_device_flags(arch), "-I", str(include), *config.extra_flags],
                           runtime_source(source), config.nvcc_timeout_s, CUBIN_NAME)


def check_key(source: str, config: RuntimeConfig) -> str:
    """The cache key `check_compiles` gives `source` under `config`, without compiling: its content with
    the runtime's footer, the flags, the arch, nvcc's version and the headers' id (no path)."""
    _, include, arch, version = _toolchain(source, config)
    return _check_key(source, include, arch, version, config)


def _check_key(source: str, include: Path, arch: str, version: str, config: RuntimeConfig) -> str:
    return cache_key(runtime_source(source), [*_device_flags(arch), *config.extra_flags], arch, version,
                     headers_id(include))


def _device_flags(arch: str) -> list[str]:
    """nvcc's flags for the device code alone (check_compiles), without the include folder."""
    return [f for f in nvcc_flags(arch, None) if f not in _LIBRARY_ONLY_FLAGS] + ["-cubin"]


# -------------------------------------------------------------------------------------- compile


def _compile_into(entry: Path, command: list[str], full_source: str, arch: str, timeout_s: float,
                  output: str = LIBRARY_NAME) -> float:
    """Run nvcc in a fresh temporary folder and move the results into `entry`; returns seconds taken."""
    work = Path(tempfile.mkdtemp(prefix=entry.name[:12] + "-", dir=entry.parents[1] / "tmp"))
    try:
        (work / SOURCE_NAME).write_text(full_source, encoding="utf-8")
        start = time.perf_counter()
        returncode = _run_nvcc([*command, "-o", output, SOURCE_NAME], work, timeout_s)
        compile_s = time.perf_counter() - start
        head, tail = _read_log(work / LOG_NAME)
        succeeded = returncode == 0 and (work / output).is_file()
        entry.mkdir(exist_ok=True)
        meta = {"command": command[1:], "arch": arch, "returncode": returncode, "compile_s": round(compile_s, 3)}
        (work / "build.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        for name in (SOURCE_NAME, LOG_NAME, "build.json"):  # kept for failures too, for humans
            os.replace(work / name, entry / name)
        if returncode is None:
            raise BuildError(
                f"nvcc did not finish within {timeout_s:g} s (nvcc_timeout_s) and was stopped;"
                f" log: {entry / LOG_NAME}.",
                "Cut the compile-time work (fewer template instantiations, kernel variants or unrolled"
                " iterations), or raise nvcc_timeout_s.",
                distilled=f"nvcc timed out after {timeout_s:g} s.",
                log_tail=tail,
            )
        if not succeeded:
            raise BuildError(
                f"nvcc could not compile the source for {arch} (exit {returncode}); full log: {entry / LOG_NAME}.",
                "Fix the first error shown; the later ones often follow from it.",
                distilled=distill_errors(head, full_source, SOURCE_NAME),
                log_tail=tail,
            )
        os.replace(work / output, entry / output)  # last: marks the entry complete
        return compile_s
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_nvcc(command: list[str], cwd: Path, timeout_s: float) -> int | None:
    """Run nvcc with its output in cwd/build.log; None when it ran past the timeout (group killed)."""
    env = {**os.environ, "TMPDIR": str(cwd)}  # nvcc's intermediates land in cwd and die with it
    with open(cwd / LOG_NAME, "wb") as log:
        try:
            proc = subprocess.Popen(
                command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        except OSError as err:
            raise ToolchainError(
                f"nvcc ({command[0]}) could not be started: {err}.", "Check the CUDA toolkit install."
            ) from None
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None
        except BaseException:  # e.g. KeyboardInterrupt: never leave a compiler running behind us
            _kill_group(proc)
            raise


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # nvcc's children (cicc, ptxas, gcc) are in the same group
    except ProcessLookupError:
        pass
    proc.wait()
    # nvcc's children are not ours to reap, and a killed compiler takes a moment to free its memory:
    # the build reports the timeout once none of them runs any more.
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and _group_running(proc.pid):
        time.sleep(0.05)


def _group_running(group: int) -> bool:
    """Whether a process of process group `group` is still running (not a zombie), read from /proc;
    False where there is no /proc."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return False
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, _, pgrp = stat.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == group and state not in ("Z", "X"):
            return True
    return False


def _read_log(path: Path) -> tuple[str, str]:
    """The start of the log (where the first errors are) and its tail, both bounded."""
    with open(path, "rb") as f:
        head = f.read(_LOG_HEAD_BYTES)
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _LOG_TAIL_CHARS))
        tail = f.read()
    return head.decode("utf-8", "replace"), tail.decode("utf-8", "replace")
