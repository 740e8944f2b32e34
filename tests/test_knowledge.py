"""The knowledge pack: selection by workload class, op signature, dtype and track within a budget;
code excerpts that are verbatim slices of the compiled example kernels; pitfalls that match the
compiler's messages; the example candidates themselves (static checks, parameters like the
reference's). All CPU-only; compiling is in test_knowledge_pitfalls.py and test_examples_compile.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from cutegen import knowledge
from cutegen.errors import ConfigError
from cutegen.evaluate.checks_static import run_static_checks
from cutegen.knowledge import (
    COMMON,
    DEFAULT_BUDGET_CHARS,
    GUIDE_HEADER,
    PITFALLS,
    full_guide,
    load_pack,
    pitfall_entries,
    pitfalls_for,
    select_knowledge,
    task_dtypes,
)
from cutegen.records import WORKLOAD_CLASSES
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = sorted((REPO / "examples" / "candidates").glob("*.py"))
PITFALL_SNIPPETS = sorted((REPO / "tests" / "pitfalls").glob("*.cu"))
TORCH_DTYPES = {"float32", "float16", "bfloat16", "float64"}
# New example candidates of the pack and the task each one answers (same constructor arguments).
PACK_EXAMPLES = {
    "layer_norm_cute.py": "layer_norm.py",
    "matmul_3xtf32_cute.py": "matmul.py",
    "gemm_bf16_wgmma.py": "matmul_bf16.py",
    "conv2d_implicit_gemm_cute.py": "conv2d.py",
}


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # declaring a CuteKernel compiles nothing
    return module


def _titles(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


# ------------------------------------------------------------------------------------------ the pack


def test_pack_has_the_guide_every_class_and_the_pitfalls():
    pack = load_pack()
    for name in [COMMON, PITFALLS] + [f"{c}.md" for c in WORKLOAD_CLASSES]:
        assert pack.get(name), f"templates/knowledge/{name} is missing or empty"


def test_selectors_name_known_values():
    for name, sections in load_pack().items():
        for section in sections:
            where = f"{name} / {section.title}"
            assert set(section.dtypes) <= TORCH_DTYPES, where
            assert set(section.tracks) <= {"fp32", "tf32"}, where
            assert section.priority >= 0, where
            assert "<!--" not in section.text, f"{where}: a selector comment was left in the text"


def test_core_of_the_guide_fits_the_budget_with_room_for_an_example():
    core = sum(len(s.text) for s in load_pack()[COMMON] if s.priority == 0 and not s.tracks)
    largest = max(len(s.text) for name, secs in load_pack().items() if name != PITFALLS for s in secs)
    assert core + largest < DEFAULT_BUDGET_CHARS, (core, largest)


@pytest.mark.parametrize("workload", WORKLOAD_CLASSES)
@pytest.mark.parametrize("budget", [0, 2_000, 7_000, DEFAULT_BUDGET_CHARS])
def test_selection_stays_within_the_budget(workload, budget):
    text = select_knowledge(workload, ("mm", "convolution", "_softmax"), budget_chars=budget)
    assert len(text) <= budget
    if budget == 0:
        assert text == ""
    if budget == DEFAULT_BUDGET_CHARS:
        for title in ("CuTe in brief", "Layouts and their algebra", "Residue tiles: predication"):
            assert title in _titles(text), (workload, title)


def test_negative_budget_is_a_config_error():
    with pytest.raises(ConfigError):
        select_knowledge("gemm", budget_chars=-1)


def test_gemm_notes_follow_dtype_and_track():
    bf16 = _titles(select_knowledge("gemm", ("mm",), dtypes=("bfloat16",), track="fp32"))
    fp32 = _titles(select_knowledge("gemm", ("mm",), dtypes=("float32",), track="fp32"))
    assert "Worked example: bf16 GEMM on Hopper with TMA and wgmma" in bf16
    assert not any("3xTF32" in t or "SIMT" in t for t in bf16)
    assert "Worked example: fp32-accurate GEMM with 3xTF32 mma.sync" in fp32
    assert not any("wgmma" in t for t in fp32)
    tf32 = _titles(select_knowledge("gemm", ("mm",), dtypes=("float32",), track="tf32"))
    assert "Precision: the tf32 track" in tf32 and "Precision: the fp32 track" not in tf32
    assert not any("3xTF32" in t for t in tf32)  # the 3xTF32 example is for the fp32 track only


def test_sections_come_out_in_reading_order():
    text = select_knowledge("norm", ("native_layer_norm",), dtypes=("float32",), track="fp32")
    titles = _titles(text)
    common = [s.title for s in load_pack()[COMMON]]
    norm = [s.title for s in load_pack()["norm.md"]]
    positions = [(0, common.index(t)) if t in common else (1, norm.index(t)) for t in titles]
    assert positions == sorted(positions)
    assert titles[-1] == "Worked example: LayerNorm with the row in registers"


def test_fused_chain_borrows_the_notes_of_its_anchor_op():
    linear_gelu = _titles(select_knowledge("fused_chain", ("addmm", "gelu"), dtypes=("float32",), track="fp32"))
    assert "Fused chains" in linear_gelu
    assert "Worked example: fp32-accurate GEMM with 3xTF32 mma.sync" in linear_gelu
    softmax_scale = _titles(select_knowledge("fused_chain", ("_softmax", "mul"), dtypes=("float32",)))
    assert not any("GEMM" in t for t in softmax_scale)
    assert "Worked example: softmax in one pass (online max and sum)" in softmax_scale


def test_unknown_class_reads_as_other():
    assert select_knowledge("no-such-class") == select_knowledge("other")


def test_a_plain_folder_of_notes_works(tmp_path):
    (tmp_path / "common.md").write_text("Always vectorise.\n")
    (tmp_path / "gemm.md").write_text("<!-- a note for humans -->\nUse wgmma.\n")
    assert select_knowledge("gemm", folder=tmp_path) == "Always vectorise.\n\n<!-- a note for humans -->\nUse wgmma."
    assert select_knowledge("norm", folder=tmp_path) == "Always vectorise."
    assert select_knowledge("gemm", folder=tmp_path, budget_chars=20) == "Always vectorise."
    assert select_knowledge("gemm", folder=tmp_path / "absent") == ""


def test_a_bad_selector_is_a_config_error(tmp_path):
    (tmp_path / "common.md").write_text("## Title\n<!-- ops: mm; colour: red -->\ntext\n")
    with pytest.raises(ConfigError, match="colour"):
        select_knowledge("gemm", folder=tmp_path)
    (tmp_path / "common.md").write_text("## Title\n<!-- priority: high -->\ntext\n")
    with pytest.raises(ConfigError, match="priority"):
        select_knowledge("gemm", folder=tmp_path)


def test_the_shipped_pack_is_selected_by_default():
    text = select_knowledge("gemm")
    assert "## CuTe in brief" in text and "## Choosing the GEMM path" in text


# ------------------------------------------------------------------------------ the plain-CUDA pack

CUDA_SNIPPETS = REPO / "tests" / "knowledge_cuda" / "snippets.cu"


def test_cuda_pack_selectors_are_valid_and_its_core_always_fits():
    pack = load_pack(backend="cuda")
    assert pack.get(COMMON) and PITFALLS not in pack  # the pitfalls are shared (module docstring)
    for name, sections in pack.items():
        for section in sections:
            assert set(section.dtypes) <= TORCH_DTYPES and set(section.tracks) <= {"fp32", "tf32"}, section.title
            assert "<!--" not in section.text, section.title
    core = [s.title for s in pack[COMMON] if s.priority == 0 and not s.tracks]
    for workload in WORKLOAD_CLASSES:
        titles = _titles(select_knowledge(workload, track="fp32", backend="cuda"))
        assert set(core) <= set(titles) and "Precision: the fp32 track" in titles, workload
    with pytest.raises(ConfigError, match="triton"):
        select_knowledge("gemm", backend="triton")


def test_cuda_pack_code_excerpts_are_verbatim_slices_of_the_compiled_snippets():
    lines = [line.strip() for line in CUDA_SNIPPETS.read_text().splitlines()]
    blocks = [(name, b) for name in load_pack(backend="cuda")
              for b in re.findall(r"```cuda\n(.*?)```", (knowledge.pack_folder(backend="cuda") / name).read_text(), re.S)]
    assert len(blocks) >= 5  # vectors, reductions, cp.async, mma.sync, softmax
    for name, block in blocks:
        for fragment in _fragments(block):
            assert _contains_run(lines, fragment), (
                f"a ```cuda excerpt in knowledge_cuda/{name} is not a verbatim slice of {CUDA_SNIPPETS.name}:\n"
                + "\n".join(fragment[:5]))


def test_task_dtypes_come_from_the_inputs_on_meta():
    assert task_dtypes(load_task(REPO / "examples" / "tasks" / "matmul_bf16.py")) == ("bfloat16",)
    assert task_dtypes(load_task(REPO / "examples" / "tasks" / "conv2d.py")) == ("float32",)


def test_docs_guide_is_generated_from_the_pack():
    assert (REPO / "docs" / "cute-guide.md").read_text() == GUIDE_HEADER + full_guide(), (
        "docs/cute-guide.md is out of date: run `python -m cutegen.knowledge > docs/cute-guide.md`")


# ---------------------------------------------------------------------------------- code excerpts


def _example_lines() -> dict[str, list[str]]:
    return {p.name: [line.strip() for line in _module(p, f"pack_{p.stem}").CUDA_SRC.splitlines()]
            for p in CANDIDATES}


def _fragments(block: str) -> list[list[str]]:
    """A ```cuda block split at `// ...` elision lines into runs of stripped lines."""
    fragments: list[list[str]] = [[]]
    for line in block.splitlines():
        if line.strip().startswith("// ..."):
            fragments.append([])
        else:
            fragments[-1].append(line.strip())
    return [f for f in fragments if any(f)]


def _contains_run(lines: list[str], run: list[str]) -> bool:
    return any(lines[i:i + len(run)] == run for i in range(len(lines) - len(run) + 1))


def test_code_excerpts_are_verbatim_slices_of_compiled_examples():
    examples = _example_lines()
    blocks = [(name, b) for name, text in ((n, (knowledge.pack_folder() / n).read_text())
                                           for n in load_pack()) for b in re.findall(r"```cuda\n(.*?)```", text, re.S)]
    assert len(blocks) >= 7  # elementwise, softmax, LayerNorm, 3xTF32, wgmma, SIMT, epilogue, conv
    for name, block in blocks:
        for fragment in _fragments(block):
            assert any(_contains_run(lines, fragment) for lines in examples.values()), (
                f"a ```cuda excerpt in {name} is not a verbatim slice of any examples/candidates source:\n"
                + "\n".join(fragment[:5]))


# -------------------------------------------------------------------------------------- pitfalls


def _expectation(path: Path) -> str:
    match = re.search(r"^// Expect: (.+)$", path.read_text(), re.M)
    assert match, f"{path.name} has no `// Expect:` line"
    return match.group(1)


def test_every_pitfall_message_is_reproduced_by_a_snippet_and_back():
    quoted = {m for _, messages in pitfall_entries() for m in messages}
    expected = {_expectation(p) for p in PITFALL_SNIPPETS}
    assert len(quoted) >= 12 and len(PITFALL_SNIPPETS) >= 12
    assert expected == quoted, (sorted(expected - quoted), sorted(quoted - expected))


def test_pitfalls_for_picks_the_entries_of_a_distilled_error():
    distilled = ('kernel.cu:7: error: static assertion failed with "Copy_Traits: src failed to vectorize into'
                 ' registers. Layout is incompatible with this CopyOp." [in cute/atom/copy_traits.hpp:128]')
    text = pitfalls_for(distilled)
    assert text.startswith("### A copy atom wider than the contiguous run") and "Fix:" in text
    assert pitfalls_for("kernel.cu:3: error: expected a \";\"") == ""
    both = pitfalls_for(distilled + "\nkernel.cu:9: error: expression must have a constant value")
    assert both.count("### ") == 2
    assert pitfalls_for(distilled, max_chars=10) == ""


# ------------------------------------------------------------------------------ example candidates


@pytest.mark.parametrize("path", CANDIDATES, ids=[p.stem for p in CANDIDATES])
def test_example_candidates_pass_the_static_checks(path):
    assert run_static_checks(path.read_text(), backend="cute") == ()


@pytest.mark.parametrize("candidate", sorted(PACK_EXAMPLES))
def test_pack_examples_have_the_reference_parameters(candidate):
    task = _module(REPO / "examples" / "tasks" / PACK_EXAMPLES[candidate], f"task_{candidate[:-3]}")
    model_new = _module(REPO / "examples" / "candidates" / candidate, f"pack_{candidate[:-3]}").ModelNew
    init = task.get_init_inputs()
    reference = {k: tuple(v.shape) for k, v in task.Model(*init).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in model_new(*init).state_dict().items()} == reference
