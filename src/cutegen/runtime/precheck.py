"""Checks on a CUDA source before nvcc runs: mistakes whose compiler message misleads, named plainly.

The most vexing parse of a dim3: `dim3 grid(unsigned(n));` declares a FUNCTION named grid (C++ reads
anything that can be a declaration as one, and `unsigned(n)` can be a parameter named n), so the
launch `kernel<<<grid, ...>>>` fails with "no suitable constructor exists to convert from "dim3
(unsigned int)" to "dim3"", which names neither the cause nor the fix. Models wrote it in 5 of 16 new
kernels in one bench run. The check flags a dim3 declared with parentheses whose every argument reads
as a parameter declaration (a builtin or fixed-width type, optionally with a name in parentheses, or
nothing at all), and only when that name is then used in a launch configuration: a declaration that is
never used compiles, so flagging it would reject a valid program. `dim3 grid{unsigned(n)};`,
`dim3 grid(n);`, `dim3 grid((n + 1) / 2);` and `dim3 grid(static_cast<unsigned>(n));` are variables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cutegen.errors import BuildError

_TYPE = (r"(?:(?:un)?signed(?:\s+(?:char|short|int|long(?:\s+long)?))?(?:\s+int)?|int|long(?:\s+long)?(?:\s+int)?"
         r"|short|char|bool|float|double|(?:std::)?size_t|(?:std::)?u?int(?:8|16|32|64)_t)")
_PARAMETER = re.compile(rf"^\s*(?:const\s+)?{_TYPE}\s*(?:\(\s*[A-Za-z_]\w*\s*\)|[A-Za-z_]\w*)?\s*$")
_DECLARATION = re.compile(r"\bdim3\s+(?:const\s+)?(?P<name>[A-Za-z_]\w*)\s*\((?P<args>[^;{}]*)\)\s*;")
_LAUNCH = re.compile(r"<<<(?P<config>.*?)>>>", re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# The start of the compiler's own message, as pitfalls.md quotes it, so repair prompts get that entry.
MESSAGE = 'no suitable constructor exists to convert from "dim3 ('


@dataclass(frozen=True)
class VexingParse:
    """A dim3 that C++ reads as a function declaration, and is launched with."""

    line: int  # 1-based line in the source
    name: str  # the name it declares
    text: str  # the declaration as written
    fixed: str  # the same with braces


def _blank_comments(source: str) -> str:
    """Comments replaced by spaces (newlines kept), so positions and line numbers stay."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)


def _split_arguments(text: str) -> list[str] | None:
    """Top-level comma-separated arguments; None when parentheses do not balance."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if depth < 0:
            return None
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return None if depth else parts + [current]


def vexing_parses(source: str) -> list[VexingParse]:
    """Every dim3 declaration of `source` that declares a function and is then used in a launch."""
    code = _blank_comments(source)
    found = []
    for match in _DECLARATION.finditer(code):
        args = _split_arguments(match.group("args"))
        if args is None or not (args == [""] or all(_PARAMETER.match(a) for a in args)):
            continue
        name = re.compile(rf"\b{re.escape(match.group('name'))}\b")
        if not any(name.search(launch.group("config")) for launch in _LAUNCH.finditer(code, match.end())):
            continue
        text = " ".join(source[match.start():match.end()].split())
        fixed = f"{text[:text.index('(')].rstrip()}{{{match.group('args').strip()}}};"
        found.append(VexingParse(code.count("\n", 0, match.start()) + 1, match.group("name"), text, fixed))
    return found


def precheck(source: str, filename: str = "kernel.cu") -> None:
    """Raise BuildError, as nvcc's own failure would be, with feedback that names the cause and the fix."""
    problems = vexing_parses(source)
    if not problems:
        return
    lines = [f"{filename}:{p.line}: error: `{p.text}` declares a function named `{p.name}` (the most"
             f" vexing parse), so the launch that uses it"
             f" fails to build ({MESSAGE}...)\" to \"dim3\"). Fix: brace-initialize: `{p.fixed}`." for p in problems]
    raise BuildError(f"The source declares {len(problems)} dim3 launch configuration(s) as functions;"
                     " found before compiling.", "Brace-initialize each dim3 as shown.",
                     distilled="\n".join(lines))
