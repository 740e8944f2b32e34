"""Turn an nvcc build log into the few lines a person or a model needs to fix the source.

A failed CuTe build prints hundreds of lines: every error inside a CuTe header comes with a chain of
"detected during instantiation of ..." lines whose template arguments run to kilobytes. What is needed
to act is much less: which line of the candidate's own source triggered the error, what the compiler
said, and that source line itself. `distill_errors` keeps exactly that for the first few errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHARS = 1500  # short enough to paste into a repair prompt next to the source
MAX_ERRORS = 4  # later errors usually follow from the first ones
_MAX_MESSAGE = 200
_MAX_SOURCE_LINE = 160

# The three families of errors nvcc passes on: the EDG front end ("file(12): error: ..."), the host
# compiler ("file:12:5: error: ..."), and the device back end / linker ("ptxas error : ...").
_EDG_ERROR = re.compile(r"^(?P<file>\S.*?)\((?P<line>\d+)\): (?:catastrophic )?error(?: #[\w-]+)?: (?P<msg>.*)$")
_GCC_ERROR = re.compile(r"^(?P<file>\S.*?):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)$")
_TOOL_ERROR = re.compile(r"^(?P<tool>ptxas|nvlink|nvcc|fatbinary|cicc)\s*(?:fatal|error)\s*: (?P<msg>.*)$")
_LINKER_ERROR = re.compile(r"^(?P<msg>.*(?:undefined reference to|ld returned).*)$")
# "instantiation of "..." at line 12 of file.cu", or "at line 12" meaning the file of the error itself.
_CHAIN_LINE = re.compile(r'at line (?P<line>\d+)(?: of (?P<file>\S+))?\s*$')
_GCC_NOTE = re.compile(r"^(?P<file>\S.*?):(?P<line>\d+):(?:\d+:)? note: ")
_INCLUDE_PREFIX = re.compile(r"(?:/[^\s\"'(]*)?/include/")
_WITH_CLAUSE = re.compile(r" \[with [^\]]{40,}\]")
_STUB_FILE = re.compile(r"\S*tmpxft_[\w.-]*?\.cudafe1\.stub\.c")
_ERROR_COUNT = re.compile(r"^(\d+) errors? detected in the compilation")


@dataclass
class _Error:
    message: str
    file: str | None  # where the compiler reported it (a header, the source, or None for ptxas)
    line: int | None
    origin_line: int | None = None  # the outermost line of the candidate's source that led to it
    chain_depth: int = 0  # template instantiation levels between origin_line and the error

    def user_line(self, filename: str) -> int | None:
        return self.line if _is_user_file(self.file, filename) else self.origin_line


def _shorten(text: str, limit: int) -> str:
    text = _WITH_CLAUSE.sub(" [with ...]", _INCLUDE_PREFIX.sub("", text.strip()))
    text = _STUB_FILE.sub("<nvcc host stub>", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_user_file(path: str | None, filename: str) -> bool:
    return path is not None and (path == filename or path.endswith("/" + filename))


def _header(line: str) -> _Error | None:
    for pattern in (_EDG_ERROR, _GCC_ERROR):
        m = pattern.match(line)
        if m:
            return _Error(m["msg"], m["file"], int(m["line"]))
    m = _TOOL_ERROR.match(line)
    if m:
        return _Error(f"{m['tool']}: {m['msg']}", None, None)
    m = _LINKER_ERROR.match(line)
    return _Error(m["msg"], None, None) if m else None


def _trace_to_user(err: _Error, body: list[str], filename: str) -> None:
    """Find the outermost line of the candidate's source in the error's instantiation chain."""
    chain = [m for m in (_CHAIN_LINE.search(b) for b in body) if m and "instantiation" in m.string]
    err.chain_depth = len(chain)
    for m in chain:  # innermost first: the last entry naming the user's file is the outermost call site
        if _is_user_file(m["file"] or err.file, filename):
            err.origin_line = int(m["line"])
    if err.origin_line is None and not _is_user_file(err.file, filename):
        for b in body:  # host-compiler errors in generated stubs point at the source through notes
            m = _GCC_NOTE.match(b)
            if m and _is_user_file(m["file"], filename):
                err.origin_line = int(m["line"])
                break


def _parse(log: str, filename: str) -> list[_Error]:
    errors: list[_Error] = []
    current: _Error | None = None
    body: list[str] = []
    for line in log.splitlines() + [""]:
        err = _header(line)
        if err is not None or (not line.strip() and current is not None):
            if current is not None:
                _trace_to_user(current, body, filename)
                errors.append(current)
            current, body = err, []
        elif current is not None:
            body.append(line)
    return errors


def _source_line(source_lines: list[str], number: int | None) -> str:
    if number is None or not 0 < number <= len(source_lines):
        return ""
    return f"{number} | {_shorten(source_lines[number - 1], _MAX_SOURCE_LINE)}"


def _render(err: _Error, source_lines: list[str], filename: str) -> str:
    in_user = _is_user_file(err.file, filename)
    line = err.user_line(filename)
    text = f"{filename}:{line}: " if line else ""
    text += f"error: {_shorten(err.message, _MAX_MESSAGE)}"
    if err.file and not in_user and err.line:
        text += f" [in {_shorten(err.file, 80)}:{err.line}"
        text += f", {err.chain_depth} template levels below this line]" if err.chain_depth else "]"
    if _source_line(source_lines, line):
        text += "\n  " + _source_line(source_lines, line)
    if in_user and err.origin_line and err.origin_line != err.line:
        text += f"\n  instantiated from {filename}:" + _source_line(source_lines, err.origin_line)
    return text


def distill_errors(log: str, source: str, filename: str = "kernel.cu") -> str:
    """The first errors of an nvcc log, each with the offending line of `source`, in <= ~1500 chars.

    `filename` is the name the source was compiled under (the runtime uses kernel.cu); errors inside
    headers are traced back through their instantiation chain to the line of `source` that caused
    them. A log with no recognisable error lines is returned as its last lines, trimmed.
    """
    errors = _parse(log, filename)
    if not errors:
        tail = "\n".join(line for line in log.strip().splitlines()[-12:])
        return _shorten(tail, MAX_CHARS) if tail else "nvcc failed without printing an error."
    source_lines = source.splitlines()
    shown: list[str] = []
    seen: set[object] = set()
    for err in errors:
        # Errors that cascade from one bad line repeat its line number: show each line once.
        key = err.user_line(filename) or err.message
        if key in seen:
            continue
        seen.add(key)
        block = _render(err, source_lines, filename)
        if len(shown) >= MAX_ERRORS or sum(len(s) + 1 for s in shown) + len(block) > MAX_CHARS - 80:
            break
        shown.append(block)
    total = next((int(m[1]) for m in map(_ERROR_COUNT.match, log.splitlines()) if m), len(errors))
    if not shown:  # the first error alone is too long: cut it rather than show nothing
        shown.append(_render(errors[0], source_lines, filename)[: MAX_CHARS - 80])
    if total > len(shown):
        shown.append(f"({total} errors in total; the {total - len(shown)} not shown mostly follow from these.)")
    return "\n".join(shown)
