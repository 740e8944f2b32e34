"""Argument codes of a launcher, and a check of them against the C declaration in the source.

ctypes cannot see a C function's parameter types: if the Python declaration says "i64" where the C
launcher takes `int`, or forgets an argument, the call passes garbage without any error. So when a
`CuteKernel` is declared, each launcher's parameter list is read from the source (a regular
expression, no compiler) and compared with its codes. Types the table below does not know (a
template alias, a struct) are not judged; a launcher that cannot be found is left to the linker check
after the build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cutegen.errors import ConfigError

# Tensor codes -> torch dtype attribute names; scalar codes -> ctypes type names.
TENSOR_CODES = {
    "f32*": "float32",
    "f16*": "float16",
    "bf16*": "bfloat16",
    "f64*": "float64",
    "i32*": "int32",
    "i64*": "int64",
    "u8*": "uint8",
    "i8*": "int8",
    "bool*": "bool",
}
SCALAR_CODES = {"i32": "c_int32", "i64": "c_int64", "f32": "c_float", "f64": "c_double"}

# C spellings of each code's element type; `void*` matches every tensor code.
_C_TYPES = {
    "f32": ("float",),
    "f16": ("half", "__half", "cutlass::half_t", "half_t"),
    "bf16": ("__nv_bfloat16", "nv_bfloat16", "cutlass::bfloat16_t", "bfloat16_t"),
    "f64": ("double",),
    "i32": ("int", "int32_t", "std::int32_t", "signed int"),
    "i64": ("int64_t", "std::int64_t", "long", "long long", "long int", "long long int", "ptrdiff_t", "size_t"),
    "u8": ("uint8_t", "std::uint8_t", "unsigned char"),
    "i8": ("int8_t", "std::int8_t", "signed char"),
    "bool": ("bool",),
}
_KNOWN = {spelling: code for code, spellings in _C_TYPES.items() for spelling in spellings}
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_QUALIFIERS = re.compile(r"\b(?:const|volatile|__restrict__|__restrict|restrict)\b")


@dataclass(frozen=True)
class CParam:
    """One parameter of a C launcher as written in the source."""

    text: str  # e.g. "float const* __restrict__ x"
    name: str | None  # "x"; None when the declaration leaves it out
    base: str  # element type with qualifiers removed: "float"
    pointer: bool


def check_codes(launcher: str, codes: tuple[str, ...]) -> None:
    if not _IDENT.match(launcher):
        raise ConfigError(
            f"Launcher name {launcher!r} is not a C identifier.",
            'Use the name of the `extern "C"` launcher function as it is spelled in the source.',
        )
    for index, code in enumerate(codes):
        if code not in TENSOR_CODES and code not in SCALAR_CODES:
            raise ConfigError(
                f"Argument {index} of launcher {launcher} has the unknown type code {code!r}.",
                f"Use one of {', '.join(TENSOR_CODES)} for tensors or {', '.join(SCALAR_CODES)} for scalars.",
            )


def _split_param(text: str) -> CParam:
    text = " ".join(text.split())
    pointer = "*" in text or text.endswith("[]")
    bare = _QUALIFIERS.sub(" ", text.replace("*", " ").replace("[]", " ").replace("&", " "))
    words = bare.split()
    name = words[-1] if len(words) > 1 and words[-1] not in _KNOWN and _IDENT.match(words[-1]) else None
    base = " ".join(words[:-1] if name else words)
    return CParam(text, name, base, pointer)


def c_parameters(source: str, launcher: str) -> list[CParam] | None:
    """The parameters of the definition `int launcher(...) {` in `source`; None unless found exactly once."""
    pattern = re.compile(r"\b(?:int|cudaError_t)\s+" + re.escape(launcher) + r"\s*\(([^()]*)\)\s*\{")
    matches = pattern.findall(source)
    if len(matches) != 1:
        return None
    params = [p for p in matches[0].split(",") if p.strip()]
    return [_split_param(p) for p in params]


def _mismatch(code: str, param: CParam) -> str | None:
    """Why `param` cannot receive an argument of `code`, or None when it can (or cannot be judged)."""
    wants_pointer = code.endswith("*")
    if wants_pointer != param.pointer:
        kind = "tensor (a pointer)" if wants_pointer else "scalar (not a pointer)"
        return f"the code {code!r} declares a {kind} but the C parameter is `{param.text}`"
    if param.base == "void" and wants_pointer:
        return None
    known = _KNOWN.get(param.base)
    if known is not None and known != code.rstrip("*"):
        return f"the code {code!r} does not match the C type of `{param.text}`"
    return None


def check_against_source(source: str, launcher: str, codes: tuple[str, ...]) -> list[CParam] | None:
    """Raise ConfigError when the launcher's C parameter list disagrees with its codes."""
    params = c_parameters(source, launcher)
    if params is None:
        return None
    fix_count = "Declare one code per C parameter except the final `cudaStream_t stream`, which the runtime appends."
    if len(params) != len(codes) + 1:
        raise ConfigError(
            f"Launcher {launcher} takes {len(params)} parameters in the source but {len(codes)} argument codes"
            f" are declared (plus the stream the runtime appends, {len(codes) + 1} expected).",
            fix_count,
        )
    if "cudaStream_t" not in params[-1].text:
        raise ConfigError(
            f"The last parameter of launcher {launcher} is `{params[-1].text}`, not a cudaStream_t.",
            "End the C parameter list with `cudaStream_t stream` and launch every kernel on that stream.",
        )
    for index, (code, param) in enumerate(zip(codes, params)):
        why = _mismatch(code, param)
        if why:
            raise ConfigError(
                f"Argument {index} of launcher {launcher}: {why}.",
                "Make the code and the C parameter type agree (f32* = float*, i64 = int64_t, f32 = float,"
                " i32 = int, ...); a mismatch passes garbage without any error.",
            )
    return params
