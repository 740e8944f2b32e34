"""Tasks: load KernelBench-format reference programs from a file, a folder or a suite checkout.

A task file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`. Loading reads
and checks the file without running it (syntax, the three names); `task_module` runs it in a fresh
module namespace when the caller needs the objects.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import re
import types
from pathlib import Path

from cutegen.errors import ConfigError, TaskError
from cutegen.records import Task

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_LEVEL_DIR = re.compile(r"^level(\d+)$")
_PROBLEM_FILE = re.compile(r"^(\d+)_.*\.py$")


def normalize_source(source: str) -> str:
    """Line endings to \\n, trailing whitespace dropped, one final newline: edits that change nothing
    a Python interpreter sees leave the hash alone."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


def source_sha256(source: str) -> str:
    return hashlib.sha256(normalize_source(source).encode()).hexdigest()


def _check_source(path: Path, source: str) -> None:
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise TaskError(
            f"Task file {path} has a syntax error at line {err.lineno}: {err.msg}"
            f" ({(err.text or '').strip()!r}).",
            "Correct the line so that `python -c \"import ast; ast.parse(open(FILE).read())\"` passes.",
        ) from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = [name for name in REQUIRED_NAMES if name not in defined]
    if missing:
        raise TaskError(
            f"Task file {path} does not define {', '.join(missing)} at module level; a task needs"
            " `class Model(nn.Module)`, `get_inputs()` (the forward arguments) and"
            " `get_init_inputs()` (the constructor arguments).",
            f"Add {', '.join(missing)} to {path.name}, as in the files under examples/tasks/.",
        )


def load_task(path: Path, *, task_id: str | None = None, level: int | None = None) -> Task:
    """Read and check one task file (without running it)."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(
            f"Task file {path} does not exist or is not a file.",
            "Pass the path of a .py file in KernelBench format, a folder of them, or a KernelBench checkout.",
        )
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"Task file {path} is not UTF-8 text.", "Save it as UTF-8.") from None
    _check_source(path, source)
    match = _PROBLEM_FILE.match(path.name)
    problem_id = int(match.group(1)) if match and level is not None else None
    if task_id is None:
        task_id = f"level{level}/{problem_id}" if problem_id is not None else path.stem
    return Task(
        task_id=task_id,
        name=path.stem,
        path=path,
        source=source,
        source_sha256=source_sha256(source),
        level=level,
        problem_id=problem_id,
    )


def task_module(task: Task) -> types.ModuleType:
    """Run the task's source in a fresh module and return it; errors name the task and the line."""
    module = types.ModuleType(f"cutegen_task_{task.source_sha256[:12]}")
    module.__file__ = str(task.path)
    try:
        code = compile(task.source, str(task.path), "exec")
        exec(code, module.__dict__)  # noqa: S102 - running the reference is the point
    except Exception as err:  # the reference is user code: any exception is a task problem
        line = _user_line(err, str(task.path))
        raise TaskError(
            f"Task {task.task_id} ({task.path}) raised {type(err).__name__} while loading{line}: {err}",
            "Run the file with `python FILE` to see the full traceback and fix it; a task file must"
            " import cleanly.",
        ) from err
    return module


def _user_line(err: BaseException, filename: str) -> str:
    tb = err.__traceback__
    lineno = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return f" at line {lineno}" if lineno else ""


# --------------------------------------------------------------------------------------- suites


def _is_suite(root: Path) -> bool:
    return any(_LEVEL_DIR.match(p.name) for p in root.iterdir() if p.is_dir())


def _suite_tasks(root: Path) -> list[Task]:
    tasks = []
    for level_dir in sorted(p for p in root.iterdir() if p.is_dir() and _LEVEL_DIR.match(p.name)):
        level = int(_LEVEL_DIR.match(level_dir.name).group(1))  # type: ignore[union-attr]
        files = [p for p in level_dir.iterdir() if _PROBLEM_FILE.match(p.name)]
        for path in sorted(files, key=lambda p: int(_PROBLEM_FILE.match(p.name).group(1))):  # type: ignore[union-attr]
            tasks.append(load_task(path, level=level))
    return tasks


def load_tasks(path: Path, select: str | None = None) -> list[Task]:
    """Tasks from a file, a folder of task files, or a KernelBench checkout (level1/, level2/...).

    `select` is a comma-separated list of terms: `level1` (a whole level), `level2:1-20` (a range of
    problem ids), `level1/19` (one problem), or a glob matched against the task id and file stem
    (`*relu*`). No selector means every task.
    """
    path = Path(path)
    if path.is_file():
        tasks = [load_task(path)]
    elif path.is_dir():
        if _is_suite(path):
            tasks = _suite_tasks(path)
        else:
            tasks = [load_task(p) for p in sorted(path.glob("*.py")) if not p.name.startswith("_")]
        if not tasks:
            raise TaskError(
                f"Folder {path} holds no task files (*.py) and no level<N>/ folders.",
                "Point at a task file, a folder of task files, or the root of a KernelBench checkout.",
            )
    else:
        raise TaskError(
            f"Task path {path} does not exist.",
            "Check the path; it can be a task file, a folder of task files or a KernelBench checkout.",
        )
    if select:
        tasks = select_tasks(tasks, select)
    return tasks


_LEVEL_TERM = re.compile(r"^level(\d+)(?::(\d+)(?:-(\d+))?|/(\d+))?$")


def select_tasks(tasks: list[Task], select: str) -> list[Task]:
    """Keep the tasks any selector term matches, in their original order."""
    terms = [t.strip() for t in select.split(",") if t.strip()]
    if not terms:
        raise ConfigError(f"Selector {select!r} is empty.", "Use e.g. level1, level2:1-20 or level1/19.")
    chosen: set[str] = set()
    for term in terms:
        hits = [t.task_id for t in tasks if _term_matches(term, t)]
        if not hits:
            known = ", ".join(t.task_id for t in tasks[:5]) + (" ..." if len(tasks) > 5 else "")
            raise ConfigError(
                f"Selector term {term!r} matches no task (tasks here: {known}).",
                "Use levelN, levelN:A-B, levelN/ID, or a glob on the task name such as '*relu*'.",
            )
        chosen.update(hits)
    return [t for t in tasks if t.task_id in chosen]


def _term_matches(term: str, task: Task) -> bool:
    match = _LEVEL_TERM.match(term)
    if match:
        level, lo, hi, one = match.groups()
        if task.level != int(level):
            return False
        if one is not None:
            return task.problem_id == int(one)
        if lo is not None:
            return int(lo) <= (task.problem_id or -1) <= int(hi if hi is not None else lo)
        return True
    return fnmatch.fnmatch(task.task_id, term) or fnmatch.fnmatch(task.name.lower(), term.lower())
