"""Finding the candidate in a reply, and rejecting replies that hold none, with reasons."""

from __future__ import annotations

import pytest

from cutegen.extract import BadReply, extract_candidate, fenced_blocks
from cutegen.tasks import source_sha256

MODULE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def test_takes_the_last_python_block_defining_modelnew():
    text = (
        "The reference was:\n```python\nclass Model: pass\n```\nA first try:\n"
        "```py\nclass ModelNew:\n    first = 1\n```\nThe final version:\n"
        f"```python\n{MODULE}```\nAnd the C++ part for reference:\n```cpp\nint x;\n```\n"
    )
    candidate = extract_candidate(text)
    assert candidate.source == MODULE
    assert candidate.sha256 == source_sha256(MODULE)


def test_hash_ignores_line_endings_and_trailing_spaces():
    crlf = "```python\r\n" + MODULE.replace("\n", "   \r\n") + "```\r\n"
    assert extract_candidate(crlf).sha256 == extract_candidate(f"```python\n{MODULE}```").sha256


def test_longer_fences_may_hold_backtick_fences():
    text = f"````python\n{MODULE}doc = '''\n```\nnot a fence end\n```\n'''\n````\n"
    assert "not a fence end" in extract_candidate(text).source


@pytest.mark.parametrize(
    ("text", "truncated", "reason"),
    [
        ("I would use a CuTe kernel here.", False, "no fenced code block"),
        ("```python\nclass Model(torch.nn.Module): pass\n```", False, "defines `class ModelNew`"),
        ("```python\nclass ModelNew(torch.nn.Module):\n    def forward(self x):\n        pass\n```", False,
         "syntax error at line 2"),
        ("```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x", False, "cut off"),
        ("Here is the kernel, explained at length", True, "cut off"),
        ("```python\ndef f():\n    class ModelNew: pass\n```", False, "defines `class ModelNew`"),
    ],
)
def test_bad_replies_say_why(text, truncated, reason):
    with pytest.raises(BadReply, match=reason.replace("(", r"\(").replace("`", "`")):
        extract_candidate(text, truncated=truncated)


def test_a_complete_module_before_the_cut_is_kept():
    text = f"```python\n{MODULE}```\nNow let me explain the tiling in detail: the"
    assert extract_candidate(text, truncated=True).source == MODULE


def test_fenced_blocks_reports_an_open_fence():
    blocks, left_open = fenced_blocks("```python\na = 1\n```\n```python\nb = 2\n")
    assert blocks == [("python", "a = 1")] and left_open


def test_the_idea_is_the_idea_line_else_the_first_sentence():
    from cutegen.extract import idea_of

    code = "```python\n# Idea: not this one, it is code\nclass ModelNew: ...\n```\n"
    assert idea_of("Some context first.\n**Idea:** vectorise with float4 loads.\n\n" + code) == \
        "vectorise with float4 loads."
    assert idea_of("Swish is x * sigmoid(x); silu does it in one pass. The scale follows.\n\n" + code) == \
        "Swish is x * sigmoid(x); silu does it in one pass."
    assert idea_of("1. Tile the rows. 2. Vectorise.\n" + code) == "1. Tile the rows."
    assert idea_of(code) is None
    assert len(idea_of("Idea: " + "x" * 500)) == 200
