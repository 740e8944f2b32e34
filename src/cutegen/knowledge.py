"""The knowledge packs: which notes go into a prompt, within a size budget.

A pack is a folder of Markdown files, one per backend (`PACKS`): the CuTe guide
(templates/knowledge/, for the cute backend, and the torch backend's prompts as before) and a smaller
plain-CUDA one for Hopper (templates/knowledge_cuda/: vectorized access, warp reductions, cp.async,
mma.sync through inline PTX), so that an ablation of the kernel language changes only the language
asked for and the notes about it; or a user's own folder, for any backend. Each is laid out alike:
`common.md` (the guide every prompt starts from), one file per workload class (`gemm.md`,
`norm.md`, ...; see records.WORKLOAD_CLASSES) and `pitfalls.md` (compile errors with their causes and
fixes, for repair prompts). A file is cut into sections at its `## ` headings. A section may start
with a selector comment saying when it applies:

    ## Hopper bf16 GEMM: TMA + wgmma
    <!-- ops: mm, addmm, bmm, matmul, linear; dtypes: bfloat16, float16; tracks: fp32, tf32; priority: 2 -->

`ops` are aten op names as the trace reports them (TaskTrace.aten_ops: "mm", "convolution", ...),
`dtypes` torch dtype names, `tracks` precision tracks; a missing key means "any". `priority` orders
sections (0 = always wanted; default 1). Files without comments or headings work too (a folder of
plain notes): every section then applies everywhere with priority 1.

Selection (`select_knowledge`), in order of preference until the budget is spent:
1. the priority-0 sections of common.md (the core of the guide);
2. the sections of the task's class file that match its ops, dtypes and track;
3. sections of other class files whose `ops` name one of the task's ops (a fused Linear+GELU, class
   fused_chain, borrows the GEMM notes; a softmax inside attention borrows the reduction notes; a
   convolution borrows the 3xTF32 main loop);
4. the other sections of common.md;
5. the class file's sections tagged for other ops of the same class.
A section tagged with dtypes or tracks that exclude the task is never chosen. Chosen sections are
emitted in the pack's own order (common first, then the class file, then borrowed ones), so the text
reads as written. Sections are never cut in the middle: one that does not fit is skipped.

The pitfalls (repair prompts) are the CuTe pack's pitfalls.md for every backend: entries are chosen by
the compiler's own message, so a plain-CUDA candidate meets only the entries of plain C++/CUDA errors
(the most vexing parse, anonymous namespaces, host/device calls...), and a cuda candidate that uses
CuTe (allowed) gets the CuTe ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cutegen.errors import ConfigError
from cutegen.records import WORKLOAD_CLASSES
from cutegen.tasks import task_module
from cutegen.trace import quiet_stdout

# About 4,000 tokens: room for the core of the guide and the worked example of the task's class.
DEFAULT_BUDGET_CHARS = 16_000
DEFAULT_PITFALL_CHARS = 3_000
COMMON = "common.md"
PITFALLS = "pitfalls.md"
_SELECTOR = re.compile(r"^\s*<!--(?P<body>.*?)-->\s*\n?", re.S)
_SELECTOR_KEY = re.compile(r"\b(?:ops|dtypes|tracks|priority)\s*:")
_KEYS = ("ops", "dtypes", "tracks", "priority")
_MESSAGE = re.compile(r"^Message: `(?P<text>[^`]+)`", re.M)
# The shipped pack of each backend (a folder under cutegen/templates/).
PACKS = {"cute": "knowledge", "cuda": "knowledge_cuda", "torch": "knowledge"}


@dataclass(frozen=True)
class Section:
    """One `## ` section of a pack file, with its selector."""

    file: str  # "gemm.md"
    title: str  # the heading text; "" for the text before the first heading
    text: str  # the Markdown of the section, heading included, selector comment removed
    ops: tuple[str, ...] = ()  # () = any op
    dtypes: tuple[str, ...] = ()  # () = any dtype
    tracks: tuple[str, ...] = ()  # () = any track
    priority: int = 1


def pack_folder(folder: Path | None = None, backend: str = "cute") -> Any:
    """The pack's folder: `folder` when given, else the one shipped for `backend` (PACKS)."""
    if folder is not None:
        return Path(folder)
    if backend not in PACKS:
        raise ConfigError(f"No knowledge pack for backend {backend!r}.",
                          f"Use one of {', '.join(PACKS)}, or give a folder of notes (AgentConfig.knowledge_dir).")
    return resources.files("cutegen").joinpath("templates", PACKS[backend])


def _parse_selector(body: str, where: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in body.split(";"))):
        key, sep, value = part.partition(":")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise ConfigError(
                f"The selector comment of {where} has {part!r}; expected `key: value` with a key among"
                f" {', '.join(_KEYS)}.",
                "Write e.g. `<!-- ops: mm, addmm; dtypes: bfloat16; priority: 2 -->` on the line after the heading.",
            )
        if key == "priority":
            try:
                fields[key] = int(value)
            except ValueError:
                raise ConfigError(f"The priority of {where} is not an integer: {value.strip()!r}.",
                                  "Give a whole number: 0 = always include, larger = later.") from None
        else:
            fields[key] = tuple(v.strip() for v in value.split(",") if v.strip())
    return fields


def parse_sections(name: str, text: str) -> list[Section]:
    """Cut one pack file into its sections (see the module docstring)."""
    sections = []
    chunks = re.split(r"(?m)^(?=## )", text.replace("\r\n", "\n"))
    for chunk in chunks:
        if not chunk.strip():
            continue
        title = chunk.splitlines()[0][3:].strip() if chunk.startswith("## ") else ""
        heading, _, body = chunk.partition("\n") if title else ("", "", chunk)
        fields: dict[str, Any] = {}
        match = _SELECTOR.match(body)
        if match and _SELECTOR_KEY.search(match.group("body")):  # other comments stay in the text
            fields = _parse_selector(match.group("body"), f"{name} section {title!r}")
            body = body[match.end():]
        markdown = (heading + "\n" + body if title else body).strip()
        if markdown:
            sections.append(Section(name, title, markdown, **fields))
    return sections


def load_pack(folder: Path | None = None, backend: str = "cute") -> dict[str, list[Section]]:
    """Every Markdown file of the pack, parsed: {file name: sections in file order}."""
    base = pack_folder(folder, backend)
    if not base.is_dir():
        return {}
    files = sorted((entry for entry in base.iterdir() if entry.name.endswith(".md")), key=lambda e: e.name)
    return {entry.name: parse_sections(entry.name, entry.read_text(encoding="utf-8")) for entry in files}


def _applies(section: Section, dtypes: Sequence[str], track: str | None) -> bool:
    if section.dtypes and dtypes and not set(section.dtypes) & set(dtypes):
        return False
    return not (section.tracks and track and track not in section.tracks)


def _matches_ops(section: Section, ops: set[str]) -> bool:
    return not section.ops or bool(set(section.ops) & ops)


def _ranked(pack: dict[str, list[Section]], workload_class: str, ops: set[str], dtypes: Sequence[str],
            track: str | None) -> list[tuple[int, int, Section]]:
    """(tier, priority, section) for every eligible section; lower sorts first."""
    ranked = []
    own = f"{workload_class}.md"
    for name, sections in pack.items():
        if name == PITFALLS:
            continue
        for section in sections:
            if not _applies(section, dtypes, track):
                continue
            if name == COMMON:
                tier = 1 if section.priority == 0 else 4
            elif name == own:
                tier = 2 if _matches_ops(section, ops) else 5
            elif section.ops and set(section.ops) & ops:
                tier = 3
            else:
                continue
            ranked.append((tier, section.priority, section))
    return ranked


def _emit_order(pack: dict[str, list[Section]], workload_class: str) -> dict[int, int]:
    """Position of each section (by id) in reading order: common, the class file, then the rest."""
    names = [COMMON, f"{workload_class}.md"] + [n for n in pack if n not in (COMMON, f"{workload_class}.md")]
    order: dict[int, int] = {}
    for name in names:
        for section in pack.get(name, []):
            order[id(section)] = len(order)
    return order


def select_knowledge(workload_class: str, aten_ops: Iterable[str] = (), *, dtypes: Iterable[str] = (),
                     track: str | None = None, budget_chars: int = DEFAULT_BUDGET_CHARS,
                     folder: Path | None = None, backend: str = "cute") -> str:
    """The pack's text for one task, at most `budget_chars` long ("" when the pack is absent): the
    pack in `folder`, else the one shipped for `backend`.

    `workload_class` is TaskTrace.workload_class (an unknown class reads as "other"), `aten_ops` its
    aten ops, `dtypes` the input dtypes ("float32", "bfloat16"...; empty = unknown), `track` the
    precision track ("fp32"/"tf32"; None = unknown). See the module docstring for the rules.
    """
    if budget_chars < 0:
        raise ConfigError(f"The knowledge budget is negative ({budget_chars} characters).",
                          "Give a budget of 0 (no knowledge) or more characters.")
    pack = load_pack(folder, backend)
    workload_class = workload_class if workload_class in WORKLOAD_CLASSES else "other"
    ranked = _ranked(pack, workload_class, set(aten_ops), tuple(dtypes), track)
    ranked.sort(key=lambda item: (item[0], item[1]))  # stable: file order breaks ties
    chosen: list[Section] = []
    used = 0
    for _, _, section in ranked:
        cost = len(section.text) + (2 if chosen else 0)  # the blank line that joins sections
        if used + cost <= budget_chars:
            chosen.append(section)
            used += cost
    order = _emit_order(pack, workload_class)
    return "\n\n".join(s.text for s in sorted(chosen, key=lambda s: order[id(s)]))


def task_dtypes(task: Any) -> tuple[str, ...]:
    """The floating dtypes of a task's inputs ("float32", "bfloat16"...), in first-seen order, found by
    calling its get_inputs() on the meta device (no memory, no compute); () when that fails."""
    import torch  # lazy: loading torch takes seconds

    try:
        module = task_module(task)
        with quiet_stdout(), torch.device("meta"), torch.no_grad():
            inputs = module.get_inputs()
    except Exception:  # a task whose inputs cannot be built on meta: selection then ignores dtypes
        return ()
    names: list[str] = []
    for value in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            name = str(value.dtype).removeprefix("torch.")
            if name not in names:
                names.append(name)
    return tuple(names)


def pitfall_entries(folder: Path | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """(entry Markdown, quoted compiler messages) for each `### ` entry of pitfalls.md."""
    base = pack_folder(folder)
    path = base.joinpath(PITFALLS)
    if not path.is_file():
        return []
    entries = []
    for chunk in re.split(r"(?m)^(?=### )", path.read_text(encoding="utf-8")):
        if chunk.startswith("### "):
            block = chunk.split("\n## ")[0].strip()  # an entry ends at the next section heading
            entries.append((block, tuple(m.group("text") for m in _MESSAGE.finditer(block))))
    return entries


def pitfalls_for(error_text: str, *, folder: Path | None = None, max_chars: int = DEFAULT_PITFALL_CHARS) -> str:
    """The pitfall entries whose quoted compiler message occurs in `error_text` (a distilled build
    error), in pack order, within `max_chars`; "" when none matches. For repair prompts."""
    chosen: list[str] = []
    used = 0
    for block, messages in pitfall_entries(folder):
        if any(message in error_text for message in messages):
            cost = len(block) + (2 if chosen else 0)
            if used + cost <= max_chars:
                chosen.append(block)
                used += cost
    return "\n\n".join(chosen)


def full_guide(folder: Path | None = None) -> str:
    """The whole pack as one document (docs/cute-guide.md is this text): common.md, then the class
    files in WORKLOAD_CLASSES order, then pitfalls.md, each under a `# ` title, selector comments
    removed."""
    pack = load_pack(folder)
    names = [COMMON] + [f"{c}.md" for c in WORKLOAD_CLASSES] + [PITFALLS]
    names += sorted(n for n in pack if n not in names)
    titles = {COMMON: "The CuTe guide", PITFALLS: "Pitfalls"}
    parts = []
    for name in names:
        if pack.get(name):
            title = titles.get(name, f"{name.removesuffix('.md').replace('_', ' ').capitalize()} workloads")
            parts.append(f"# {title}\n\n" + "\n\n".join(section.text for section in pack[name]))
    return "\n\n".join(parts) + "\n"


GUIDE_HEADER = (
    "<!-- Generated from src/cutegen/templates/knowledge by `python -m cutegen.knowledge > docs/cute-guide.md`;"
    " edit the pack, not this file. -->\n\n"
)


def main() -> None:
    """`python -m cutegen.knowledge`: print the whole guide (how docs/cute-guide.md is made)."""
    print(GUIDE_HEADER + full_guide(), end="")


if __name__ == "__main__":
    main()
