"""The package's import graph: no cycle among cutegen's modules, few imports hidden in functions, and
the floors of ARCHITECTURE.md kept (a module imports only from its own floor or the floors below).

The graph is read from the source with `ast`, every `import` and `from ... import` wherever it stands
(module level, inside a function, under `if TYPE_CHECKING:`), relative ones resolved, and
`from package import name` resolved to the submodule where `name` is one. It judges the graph, not the
comments beside an import: a lazy import is allowed by the count, never by a sentence."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "src" / "cutegen"
PACKAGE = "cutegen"

# Function-level imports of cutegen's own modules stay only where a worker must start fast or a heavy
# dependency would otherwise load with the module; the ceiling keeps new ones from creeping back.
MAX_FUNCTION_LEVEL_OWN_IMPORTS = 30


@dataclass(frozen=True)
class Edge:
    """One import of a cutegen module by another: where it stands and whether inside a function."""

    source: str
    target: str
    line: int
    in_function: bool


def module_name(path: Path, root: Path = PACKAGE_ROOT, package: str = PACKAGE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def package_modules(root: Path = PACKAGE_ROOT, package: str = PACKAGE) -> dict[str, Path]:
    return {module_name(path, root, package): path for path in sorted(root.rglob("*.py"))}


def _resolve_base(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    """The absolute module a `from X import ...` names: relative levels climb from the importing
    module's package (the module itself when it is a package's __init__)."""
    if node.level == 0:
        return node.module or ""
    parts = source.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _targets(node: ast.AST, source: str, is_package: bool, modules: set[str]) -> list[str]:
    """The cutegen modules one import statement loads (an outside import loads none)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _resolve_base(node, source, is_package)
        # `from cutegen.evaluate import timing` loads the submodule; `from cutegen.x import f` loads x.
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in modules:  # `import cutegen.a.b.c` where c is a name, not a module
            name = name.rpartition(".")[0]
        if name and name not in found:
            found.append(name)
    return found


def _walk(tree: ast.AST):
    """Every node with whether it stands inside a function (a lambda or a method counts)."""
    stack = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        yield node, in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def import_edges(root: Path = PACKAGE_ROOT, package: str = PACKAGE) -> list[Edge]:
    modules = package_modules(root, package)
    edges = []
    for source, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, in_function in _walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, source, is_package, set(modules)):
                if target != source:
                    edges.append(Edge(source, target, node.lineno, in_function))
    return edges


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module (or a module importing
    itself) are the cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return components


def import_cycles(edges: list[Edge], modules: set[str]) -> list[list[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for edge in edges:
        graph[edge.source].add(edge.target)
    return strongly_connected(graph)


def _describe(component: list[str], edges: list[Edge]) -> str:
    members = set(component)
    inside = sorted(
        f"  {e.source}:{e.line} -> {e.target}{' (in a function)' if e.in_function else ''}"
        for e in edges
        if e.source in members and e.target in members
    )
    return f"{len(component)} modules: {', '.join(component)}\n" + "\n".join(inside)


# The floors, lowest first. A module may import from its own floor and from any floor below it, never
# from a floor above (ARCHITECTURE.md explains each). A name is a module or a subpackage (its modules).
FLOORS: list[tuple[str, list[str]]] = [
    ("base", ["cutegen", "cutegen.errors", "cutegen.config", "cutegen.records"]),
    ("tools", ["cutegen.tasks", "cutegen.trace", "cutegen.runtime", "cutegen.manifest"]),
    ("evaluation", ["cutegen.evaluate", "cutegen.profile", "cutegen.survey"]),
    ("conversation", ["cutegen.llm", "cutegen.prompt", "cutegen.extract", "cutegen.knowledge"]),
    ("journal", ["cutegen.journal"]),
    ("results", ["cutegen.bench", "cutegen.report", "cutegen.export", "cutegen.library"]),
    ("agent", ["cutegen.agent"]),
    ("interface", ["cutegen.cli", "cutegen.__main__"]),
]


def floor_of(module: str) -> int:
    best, best_len = None, -1
    for level, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            # The package itself (its __init__, the version) is one module, not every module below it.
            matches = module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = level, len(prefix)
    if best is None:
        raise KeyError(f"{module} has no floor in FLOORS: add it (and to ARCHITECTURE.md)")
    return best


# --- the tests --------------------------------------------------------------------------------------


def test_no_import_cycle():
    edges = import_edges()
    cycles = import_cycles(edges, set(package_modules()))
    print(f"import cycles among cutegen modules: {len(cycles)}")
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, edges) for c in cycles)


def test_function_level_imports_of_own_modules_are_few():
    hidden = [e for e in import_edges() if e.in_function]
    lines = sorted(f"  {e.source}:{e.line} -> {e.target}" for e in hidden)
    print(f"function-level imports of cutegen modules: {len(hidden)}")
    print("\n".join(lines))
    assert len(hidden) <= MAX_FUNCTION_LEVEL_OWN_IMPORTS, "\n".join(lines)


def test_every_module_keeps_to_its_floor():
    upward = [
        f"  {e.source}:{e.line} ({FLOORS[floor_of(e.source)][0]}) -> {e.target} ({FLOORS[floor_of(e.target)][0]})"
        for e in import_edges()
        if floor_of(e.target) > floor_of(e.source)
    ]
    assert not upward, "imports from a floor above (see ARCHITECTURE.md):\n" + "\n".join(sorted(upward))


def test_commands_do_not_import_each_other():
    """What two commands share lives in cli/common.py or cli/options.py, never in one of the commands."""
    command = re.compile(r"cutegen\.cli\.\w+_cmd$")
    crossing = sorted(f"  {e.source}:{e.line} -> {e.target}" for e in import_edges()
                      if command.match(e.source) and command.match(e.target))
    assert not crossing, "a command module imports another:\n" + "\n".join(crossing)


# A document a comment or docstring cites by name: an upper-case name (EVALUATION.md) at the root of the
# repository, or a path from the root (docs/cute-guide.md). SOURCE.md is a file of a task suite, beside
# its tasks, not a document of this repository.
_DOC_NAME = re.compile(r"(?<![\w./-])((?:docs|bench)/[\w./-]+\.md|[A-Z][A-Z0-9_-]*\.md)\b")
_NOT_DOCUMENTS = {"SOURCE.md"}


def cited_documents(path: Path) -> set[str]:
    """The .md documents the comments and docstrings of one source file cite."""
    text = path.read_text(encoding="utf-8")
    prose = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            prose.append(ast.get_docstring(node) or "")
    return {name for chunk in prose for name in _DOC_NAME.findall(chunk)} - _NOT_DOCUMENTS


def test_every_cited_document_exists():
    repo = PACKAGE_ROOT.parents[1]
    missing = sorted(f"  {path.relative_to(repo)}: {name}" for path in package_modules().values()
                     for name in cited_documents(path) if not (repo / name).is_file())
    assert not missing, "documents cited but not in the repository:\n" + "\n".join(missing)


def test_cited_documents_are_read_from_comments_and_docstrings(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""See EVALUATION.md, "Isolation"."""\n# and docs/cute-guide.md\n'
                      'NAME = "README.md"  # a string the code uses is no citation\n'
                      'def f():\n    """A suite\'s SOURCE.md; MISSING.md."""\n', encoding="utf-8")
    assert cited_documents(source) == {"EVALUATION.md", "docs/cute-guide.md", "MISSING.md"}


# --- the graph reader itself, on a small package written for it -------------------------------------


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_reader_finds_a_cycle_through_a_function_level_relative_import(tmp_path):
    root = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.sub import b\n",
            "sub/__init__.py": "",
            "sub/b.py": "def f():\n    from .. import a  # lazy, with a reason that changes nothing\n",
            "c.py": "import json\nfrom . import a\n",
        },
    )
    edges = import_edges(root, "pkg")
    hidden = [(e.source, e.target) for e in edges if e.in_function]
    assert hidden == [("pkg.sub.b", "pkg.a")]
    # `from pkg.sub import b` is an import of the submodule pkg.sub.b, not only of the package.
    assert ("pkg.a", "pkg.sub.b") in {(e.source, e.target) for e in edges}
    assert import_cycles(edges, set(package_modules(root, "pkg"))) == [["pkg.a", "pkg.sub.b"]]


def test_reader_finds_a_cycle_through_a_package_init(tmp_path):
    # sub/__init__ imports sub.x, and x imports y, which imports the package sub (its __init__) again.
    root = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "sub/__init__.py": "from .x import f\n",
            "sub/x.py": "from pkg import y\ndef f(): pass\n",
            "y.py": "from pkg.sub import f\n",
        },
    )
    cycles = import_cycles(import_edges(root, "pkg"), set(package_modules(root, "pkg")))
    assert cycles == [["pkg.sub", "pkg.sub.x", "pkg.y"]]


def test_reader_passes_an_acyclic_package(tmp_path):
    root = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "import os\n",
            "mid.py": "from .low import *\nfrom pkg import low\n",
            "top.py": "def run():\n    from pkg.mid import thing\n",
        },
    )
    edges = import_edges(root, "pkg")
    assert import_cycles(edges, set(package_modules(root, "pkg"))) == []
    assert sorted((e.source, e.target, e.in_function) for e in edges) == [
        ("pkg.mid", "pkg.low", False),
        ("pkg.mid", "pkg.low", False),
        ("pkg.top", "pkg.mid", True),
    ]


@pytest.mark.parametrize(
    "module, floor",
    [("cutegen", "base"), ("cutegen.records", "base"), ("cutegen.evaluate.worker", "evaluation"),
     ("cutegen.cli.options", "interface")],
)
def test_floor_of_names_the_longest_prefix(module, floor):
    assert FLOORS[floor_of(module)][0] == floor


def test_a_module_without_a_floor_is_named():
    # The package's own entry is the package alone: a new top-level module gets no floor by default.
    with pytest.raises(KeyError, match="cutegen.newcomer"):
        floor_of("cutegen.newcomer")
