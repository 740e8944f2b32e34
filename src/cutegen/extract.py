"""The candidate source in a model's reply.

`idea_of` reads the model's one-line summary of what it tried (the `Idea:` line the optimize prompt
asks for, else the first sentence of its prose), for the agent's memory of tried ideas.

The candidate is the LAST fenced Python block (```python, ```py or an unlabelled fence) that defines
`ModelNew` at module level: models often show a snippet or the reference first and the full module
last. A reply that gives no usable candidate raises `BadReply` with a reason a model can act on; the
agent records it as a failed attempt, it never ends a task silently.
"""

from __future__ import annotations

import ast
import re

from cutegen.records import Candidate
from cutegen.tasks import normalize_source, source_sha256

_OPEN = re.compile(r"^ {0,3}(`{3,})[ \t]*([\w+.-]*)[^\n`]*$")
_PYTHON_TAGS = ("python", "py", "python3", "")
_DEFINES_MODELNEW = re.compile(r"^class\s+ModelNew\b", re.M)


class BadReply(Exception):
    """The reply holds no usable candidate; `reason` says why, phrased for the model."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def fenced_blocks(text: str) -> tuple[list[tuple[str, str]], bool]:
    """(info tag, body) of each closed fenced block, and whether a fence was left open at the end."""
    blocks: list[tuple[str, str]] = []
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        fence, tag = match.group(1), match.group(2).lower()
        closer = re.compile(rf"^ {{0,3}}`{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closer.match(lines[j])), None)
        if end is None:
            return blocks, True
        blocks.append((tag, "\n".join(lines[i + 1 : end])))
        i = end + 1
    return blocks, False


def extract_candidate(text: str, *, truncated: bool = False) -> Candidate:
    """The candidate in `text`, or BadReply: no code block, no ModelNew, a syntax error, or a reply
    cut off (at max_tokens, or a code fence never closed) before a complete module."""
    blocks, left_open = fenced_blocks(text)
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    with_model = [body for body in python if _DEFINES_MODELNEW.search(body)]
    if not with_model:
        if left_open or truncated:
            raise BadReply(
                "The reply was cut off before the code block closed (the reply limit was reached)."
                " Send the complete module in one ```python block, with less explanation."
            )
        if not blocks:
            raise BadReply("The reply has no fenced code block. Put the whole module in one ```python block.")
        raise BadReply(
            "No ```python block in the reply defines `class ModelNew` at module level. Send the whole"
            " module, including the ModelNew class, in one ```python block."
        )
    source = with_model[-1]
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        line = (err.text or "").strip()
        raise BadReply(
            f"The code block has a Python syntax error at line {err.lineno}: {err.msg}"
            + (f" (`{line}`)" if line else "") + ". Send the corrected whole module."
        ) from None
    if not any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body):
        raise BadReply("`ModelNew` must be a class defined at module level of the code block, not nested.")
    return Candidate(sha256=source_sha256(source), source=normalize_source(source))


IDEA_CHARS = 200
_IDEA_LINE = re.compile(r"^[\s>*_#-]*idea[*_]*\s*:[*_]*\s*(?P<text>\S.*)$", re.I)
_SENTENCE_END = re.compile(r"(?<=[^\d\s][.!?])\s")  # not after a list number ("1. ")


def prose_lines(text: str) -> list[str]:
    """The reply's lines outside fenced code blocks (an unclosed fence hides the rest)."""
    lines, inside = [], False
    for line in text.replace("\r\n", "\n").split("\n"):
        if _OPEN.match(line):  # an opening or a closing fence
            inside = not inside
            continue
        if not inside:
            lines.append(line)
    return lines


def idea_of(text: str) -> str | None:
    """The one-line summary of a reply's change: its `Idea: ...` line, else the first sentence of the
    prose before its code, shortened to IDEA_CHARS; None when the reply has no prose."""
    lines = prose_lines(text)
    for line in lines:
        match = _IDEA_LINE.match(line)
        if match:
            return shorten_idea(match.group("text"))
    before_code = text.replace("\r\n", "\n").split("```")[0]
    prose = " ".join(before_code.split())
    return shorten_idea(_SENTENCE_END.split(prose, maxsplit=1)[0]) if prose else None


def shorten_idea(text: str) -> str:
    """One line: emphasis marks dropped, white space folded, cut to IDEA_CHARS with an ellipsis."""
    text = " ".join(text.replace("**", "").split()).strip()
    return text if len(text) <= IDEA_CHARS else text[: IDEA_CHARS - 1].rstrip() + "…"
