"""Declare CuTe kernels in Python and call their C launchers with tensors.

The contract a candidate follows
--------------------------------
* Its kernels are one CUDA C++ source string using CuTe/CUTLASS headers (no PyTorch headers). nvcc
  compiles it into a shared library (see build.py); nothing is compiled when the module is imported.
* Each entry point is a launcher with C linkage that enqueues its kernels on the given stream and
  returns a cudaError_t as int (0 = success), typically `cudaGetLastError()` after the launch::

      extern "C" int swish_scale(float const* x, float* y, int64_t n, float scale, cudaStream_t stream);

* Python declares it with one type code per argument, leaving out the stream::

      kernel = CuteKernel(SOURCE, {"swish_scale": ("f32*", "f32*", "i64", "f32")})

  Tensor codes: f32* f16* bf16* f64* i32* i64* u8* i8* bool* (C: float*, half/cutlass::half_t*,
  __nv_bfloat16/cutlass::bfloat16_t*, double*, int*, int64_t*, uint8_t*, int8_t*, bool*; void* fits
  any). Scalar codes: i32 i64 f32 f64 (C: int, int64_t, float, double). The codes are checked against
  the C parameter list in the source when it can be read, because a mismatch passes garbage silently.
* `kernel.swish_scale(x, y, x.numel(), 1.5)` builds the library on first use (with the settings of
  `use_config`), checks every argument (a tensor must be a CUDA tensor on the current device, of the
  declared dtype, contiguous; a scalar a Python number in range), passes data pointers and the
  current CUDA stream (`torch.cuda.current_stream()`) as the last argument, and raises KernelError
  when the launcher returns non-zero. A wrong argument raises LaunchError before anything runs.
* The library links the CUDA runtime statically; it shares the CUDA context of PyTorch through the
  driver, so device pointers and streams from torch are valid in it.
"""

from __future__ import annotations

import ctypes
import numbers
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError, ConfigError, CutegenError, LaunchError
from cutegen.records import BuildResult
from cutegen.runtime.build import build_library, check_compiles
from cutegen.runtime.signature import SCALAR_CODES, TENSOR_CODES, CParam, check_against_source, check_codes

_CONFIG: ContextVar[RuntimeConfig | None] = ContextVar("cutegen_runtime_config", default=None)
_INT_RANGES = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1)}


def current_config() -> RuntimeConfig:
    """The settings lazy builds use here: the innermost `use_config`, else RuntimeConfig()."""
    return _CONFIG.get() or RuntimeConfig()


@contextmanager
def use_config(config: RuntimeConfig) -> Iterator[RuntimeConfig]:
    """Within the block (this thread or task only), kernels built on first call use `config`."""
    token = _CONFIG.set(config)
    try:
        yield config
    finally:
        _CONFIG.reset(token)


# A launcher's non-zero return, by CUDA error name: what usually causes it.
_ERROR_FIXES = {
    "cudaErrorInvalidConfiguration": "Check the grid and block sizes (at most 1024 threads per block, no empty"
    " grid, grid.y/z <= 65535) and the dynamic shared memory (above 48 KiB it needs cudaFuncSetAttribute"
    " with cudaFuncAttributeMaxDynamicSharedMemorySize before the launch).",
    "cudaErrorNoKernelImageForDevice": "The library was compiled for another GPU architecture: leave the arch"
    " setting unset so it is read from the device, or set it to the device's (sm_90a on H100/H200).",
    "cudaErrorLaunchOutOfResources": "The block needs more registers or shared memory than an SM has: use fewer"
    " threads per block, add __launch_bounds__, or use less shared memory.",
    "cudaErrorIllegalAddress": "A kernel accessed memory out of bounds: check the predication of residue tiles"
    " and the index arithmetic. The error is sticky: the process must restart before using the GPU again.",
    "cudaErrorMisalignedAddress": "A vector or TMA access was not aligned: check the alignment the copy atom"
    " assumes against the pointers and strides. The error is sticky: restart the process.",
}
_DEFAULT_FIX = "Check the launcher's CUDA calls and the launch configuration of its kernels."


class KernelError(CutegenError, RuntimeError):
    """A launcher returned a non-zero cudaError_t."""

    def __init__(self, launcher: str, code: int, error_name: str, description: str) -> None:
        self.launcher = launcher
        self.code = code
        self.error_name = error_name
        super().__init__(
            f"Launcher {launcher} returned CUDA error {code} ({error_name}: {description}).",
            _ERROR_FIXES.get(error_name, _DEFAULT_FIX),
        )


class CuteKernel:
    """A CuTe C++ source and its launchers; each launcher is an attribute, `kernel.NAME(*args)`.

    Declaring one (usually at module level of a candidate) only checks the declaration; the source
    is compiled and loaded by `build()` or on the first launcher call.
    """

    # The class of each `kernel.NAME`; a subclass may name a Launcher subclass (an exported torch op
    # does, to skip launches on fake tensors) and the launchers stay what build() binds.
    launcher_class: type["Launcher"]

    def __init__(self, source: str, functions: dict[str, tuple[str, ...]], name: str = "kernel") -> None:
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(
                f"CuteKernel {name!r} was given an empty source.", "Pass the CUDA C++ source as a string."
            )
        if not functions:
            raise ConfigError(f"CuteKernel {name!r} declares no launchers.", 'Pass {"launcher_name": (type codes...)}.')
        self.source = source
        self.name = name
        for fname, codes in functions.items():
            if isinstance(codes, str) or not isinstance(codes, (tuple, list)):
                raise ConfigError(
                    f"The argument codes of launcher {fname!r} must be a tuple of strings, not {codes!r}.",
                    f'Write e.g. {{"{fname}": ("f32*", "i64")}}; a single code still needs a tuple: ("f32*",).',
                )
        self.functions = {fname: tuple(codes) for fname, codes in functions.items()}
        self._lock = threading.RLock()
        self._library: ctypes.CDLL | None = None
        self.build_result: BuildResult | None = None
        for fname, codes in self.functions.items():
            check_codes(fname, codes)
            if fname in _RESERVED:
                raise ConfigError(
                    f"Launcher name {fname!r} of CuteKernel {name!r} clashes with a CuteKernel attribute.",
                    "Rename the launcher in the source and in the declaration.",
                )
            params = check_against_source(source, fname, codes)
            setattr(self, fname, self.launcher_class(self, fname, codes, params))

    def build(self, config: RuntimeConfig | None = None) -> BuildResult:
        """Compile (or take from the cache) and load the library; returns what the build did."""
        result = build_library(self.source, config if config is not None else current_config())
        library = _load(result, self)
        with self._lock:
            self._library, self.build_result = library, result
            for fname in self.functions:
                getattr(self, fname)._bind(library)
        return result

    def check(self, config: RuntimeConfig | None = None) -> BuildResult:
        """Compile the device code only, loading nothing (build.check_compiles): whether it builds."""
        return check_compiles(self.source, config if config is not None else current_config())

    def _ensure_built(self) -> None:
        with self._lock:
            if self._library is None:
                self.build()

    def error_text(self, code: int) -> tuple[str, str]:
        """(name, description) of a cudaError_t code, from the library's own CUDA runtime."""
        library = self._library
        if library is None:
            return f"error {code}", "unknown"
        return library.cutegen_error_name(code).decode(), library.cutegen_error_string(code).decode()

    def __getattr__(self, attr: str) -> Any:  # only reached for names that are not attributes
        if attr.startswith("__"):
            raise AttributeError(attr)
        declared = ", ".join(self.__dict__.get("functions", {})) or "none"
        raise AttributeError(
            f"CuteKernel {self.__dict__.get('name')!r} has no launcher {attr!r} (declared: {declared})."
        )

    def __repr__(self) -> str:
        state = "built" if self._library is not None else "not built"
        return f"CuteKernel({self.name!r}, launchers={list(self.functions)}, {state})"


_RESERVED = frozenset(dir(CuteKernel)) | {"source", "name", "functions", "build_result", "_lock", "_library",
                                          "launcher_class"}


def _load(result: BuildResult, kernel: CuteKernel) -> ctypes.CDLL:
    """dlopen the library and check that every declared launcher is exported."""
    try:
        library = ctypes.CDLL(str(result.library_path))
    except OSError as err:
        raise BuildError(
            f"The library built for CuteKernel {kernel.name!r} ({result.library_path}) could not be loaded.",
            "An undefined symbol means a function is declared but never defined: define it, or mark"
            " device-only helpers __device__ so the host library does not reference them.",
            distilled=str(err),
        ) from None
    missing = [fname for fname in kernel.functions if not hasattr(library, fname)]
    if missing:
        raise BuildError(
            f"The library for CuteKernel {kernel.name!r} does not export the launcher(s) {', '.join(missing)}.",
            'Define each launcher at namespace scope with C linkage: `extern "C" int NAME(..., cudaStream_t stream)`.',
            distilled=f"missing extern \"C\" launcher(s): {', '.join(missing)}",
        )
    for helper in ("cutegen_error_name", "cutegen_error_string"):
        getattr(library, helper).restype = ctypes.c_char_p
        getattr(library, helper).argtypes = [ctypes.c_int]
    return library


class Launcher:
    """`kernel.NAME`: checks arguments, passes pointers and the current stream, raises on a CUDA error."""

    def __init__(self, kernel: CuteKernel, name: str, codes: tuple[str, ...], params: list[CParam] | None) -> None:
        self.kernel = kernel
        self.name = name
        self.codes = codes
        self.param_names = [p.name for p in params] if params else [None] * len(codes)
        self._cfunc: Any = None
        self._converters: list[Any] | None = None

    def _bind(self, library: ctypes.CDLL) -> None:
        cfunc = library[self.name]
        cfunc.argtypes = [
            ctypes.c_void_p if code in TENSOR_CODES else getattr(ctypes, SCALAR_CODES[code]) for code in self.codes
        ] + [ctypes.c_void_p]
        cfunc.restype = ctypes.c_int
        self._cfunc = cfunc

    def __call__(self, *args: Any) -> None:
        if len(args) != len(self.codes):
            raise LaunchError(
                f"Launcher {self.name} takes {len(self.codes)} arguments ({', '.join(self.codes)}) but was"
                f" called with {len(args)}.",
                "Pass exactly the declared arguments in order; the CUDA stream is appended automatically.",
            )
        converters = self._converters if self._converters is not None else self._make_converters()
        values = [convert(self, index, arg) for index, (convert, arg) in enumerate(zip(converters, args))]
        if self._cfunc is None:
            self.kernel._ensure_built()
        code = self._cfunc(*values, _current_stream(self))
        if code != 0:
            raise KernelError(self.name, code, *self.kernel.error_text(code))

    def _make_converters(self) -> list[Any]:
        import torch  # lazy: loading torch takes seconds

        self._converters = [
            _tensor_converter(torch, getattr(torch, TENSOR_CODES[code]))
            if code in TENSOR_CODES
            else _scalar_converter(code)
            for code in self.codes
        ]
        return self._converters

    def describe_argument(self, index: int) -> str:
        name = self.param_names[index]
        return f"argument {index}" + (f" ({name})" if name else "") + f" of launcher {self.name}"

    def __repr__(self) -> str:
        return f"<launcher {self.name}({', '.join(self.codes)}) of {self.kernel!r}>"


CuteKernel.launcher_class = Launcher


def _current_stream(launcher: Launcher) -> int:
    """The handle of torch's current stream on the current device (what `torch.cuda.current_stream()`
    returns, read without building a Stream object: that costs ~4 us per launch, this ~0.1 us)."""
    import torch  # lazy: loading torch takes seconds

    try:
        device = torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream
    except (AssertionError, RuntimeError) as err:  # CPU-only torch or no device
        raise LaunchError(
            f"Launcher {launcher.name} needs a CUDA device but none is usable: {err}.",
            "Run on a machine with a CUDA GPU and a CUDA build of PyTorch.",
        ) from None


def _describe_tensor(tensor: Any) -> str:
    where = "CPU" if tensor.device.type == "cpu" else str(tensor.device)
    layout = "contiguous" if tensor.is_contiguous() else "non-contiguous"
    return f"a {layout} {str(tensor.dtype).removeprefix('torch.')} tensor on {where} of shape {tuple(tensor.shape)}"


def _tensor_converter(torch: types.ModuleType, dtype: Any) -> Any:
    def convert(launcher: Launcher, index: int, arg: Any) -> int:
        if not isinstance(arg, torch.Tensor):
            raise LaunchError(
                f"The {launcher.describe_argument(index)} must be a {dtype} CUDA tensor, but was given"
                f" {type(arg).__name__} {_short_repr(arg)}.",
                "Pass a torch tensor (scalars need a scalar code such as i64 or f32 in the declaration).",
            )
        if arg.dtype == dtype and arg.is_cuda and arg.is_contiguous():
            if arg.get_device() == torch.cuda.current_device():
                return arg.data_ptr()
        raise _tensor_error(torch, launcher, index, arg, dtype)

    return convert


def _tensor_error(torch: types.ModuleType, launcher: Launcher, index: int, arg: Any, dtype: Any) -> LaunchError:
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "the current CUDA device"
    fixes = []
    if not arg.is_cuda:
        fixes.append("move it to the GPU (`.cuda()`) before the call")
    elif f"cuda:{arg.get_device()}" != device:
        fixes.append(f"pass a tensor on {device} or make its device current (`with torch.cuda.device(t.device)`)")
    if arg.dtype != dtype:
        fixes.append(
            f"convert it (`.to({dtype})`), or declare the code that matches {arg.dtype} and change the C"
            " parameter to match"
        )
    if not arg.is_contiguous():
        fixes.append("make it contiguous (`.contiguous()`)")
    fix = "; ".join(fixes)
    return LaunchError(
        f"The {launcher.describe_argument(index)} expects a contiguous {dtype} CUDA tensor on {device},"
        f" but was given {_describe_tensor(arg)}.",
        fix[:1].upper() + fix[1:] + ".",
    )


def _scalar_converter(code: str) -> Any:
    integral = code in _INT_RANGES

    def convert(launcher: Launcher, index: int, arg: Any) -> int | float:
        wanted = numbers.Integral if integral else numbers.Real
        if isinstance(arg, wanted):
            if not integral:
                return float(arg)
            low, high = _INT_RANGES[code]
            if low <= int(arg) <= high:
                return int(arg)
        kind = f"an integer in [{_INT_RANGES[code][0]}, {_INT_RANGES[code][1]}]" if integral else "a real number"
        raise LaunchError(
            f"The {launcher.describe_argument(index)} is declared {code!r} and needs {kind}, but was given"
            f" {type(arg).__name__} {_short_repr(arg)}.",
            "Pass a Python number (for a 0-d tensor use `.item()`), or declare a wider type in the"
            " declaration and the C launcher.",
        )

    return convert


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def find_kernels(module: types.ModuleType) -> list[CuteKernel]:
    """Every CuteKernel bound to a name in `module`'s globals, in definition order, each once."""
    seen: dict[int, CuteKernel] = {}
    for value in vars(module).values():
        if isinstance(value, CuteKernel):
            seen.setdefault(id(value), value)
    return list(seen.values())
