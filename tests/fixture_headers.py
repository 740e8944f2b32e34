"""How a fixture or an example candidate says what it is judged against: its `# key: value` header
lines and its task. Used by the tests (through helpers.py) and by the GPU bench scripts, which judge
the same files, so that both read them by one rule. Imports nothing beyond the standard library."""

from __future__ import annotations

import re
from pathlib import Path

HEADER_KEYS = ("exploit", "caught-by", "task", "task-file", "backend", "backends", "needs", "fault", "device", "layer", "twin")
# `layer`: how a fixture must be judged to reach its check: "timing" (with the timing stage, where it
# cheats), "guard-off" (timing on and the audit hook off: it proves the layer behind the hook).
# The backends a fixture applies to when it has no `# backends:` line, from the backend it was written
# for: a candidate that runs its own kernels is judged alike under cuda, which allows CuTe too.
DEFAULT_BACKENDS = {"cute": ("cute", "cuda"), "cuda": ("cuda",), "torch": ("torch",)}
# An example candidate's docstring opens with "... candidate for examples/tasks/<task>.py".
_EXAMPLE_TASK = re.compile(r"candidate for (examples/tasks/\w+\.py)")


def header(path: Path) -> dict[str, str]:
    """The `# key: value` lines at the top of a fixture (the keys in HEADER_KEYS); the first value of
    a key counts."""
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() in HEADER_KEYS:
            fields.setdefault(key.strip(), value.strip())
    return fields


def backends(path: Path) -> tuple[str, ...]:
    """The backends a fixture is judged under: its `# backends:` list (e.g. `cute, cuda`), else the
    default for its `# backend:` (DEFAULT_BACKENDS; cute when it names none)."""
    fields = header(path)
    if fields.get("backends"):
        return tuple(name.strip() for name in fields["backends"].split(",") if name.strip())
    return DEFAULT_BACKENDS[fields.get("backend", "cute")]


def task_path(path: Path, repo: Path) -> Path:
    """The task file a fixture is judged against: its `# task-file:` (repo-relative; a task made for
    one fixture, under tests/fixtures/tasks/), else examples/tasks/<task>.py for its `# task:`, else
    the task an example candidate's docstring names, else the file name less `_cute`."""
    fields = header(path)
    if fields.get("task-file"):
        return repo / fields["task-file"]
    if fields.get("task"):
        return repo / "examples" / "tasks" / f"{fields['task']}.py"
    named = _EXAMPLE_TASK.search(path.read_text()[:400])
    if named:
        return repo / named.group(1)
    return repo / "examples" / "tasks" / f"{path.stem.removesuffix('_cute')}.py"


def fixtures_by_check(repo: Path) -> dict[str, tuple[list[str], list[str]]]:
    """For each `caught-by` name of tests/fixtures/cheats/: the cheat fixtures that name it and the honest
    twins they name (repo-relative paths, sorted). The registry of checks (cutegen.evaluate.checks)
    lists no fixtures: this is where a check's fixtures are read, from the one place each says it."""
    found: dict[str, tuple[list[str], list[str]]] = {}
    for path in sorted((repo / "tests" / "fixtures" / "cheats").glob("[0-9][0-9]_*.py")):
        fields = header(path)
        cheats, twins = found.setdefault(fields.get("caught-by", ""), ([], []))
        cheats.append(path.relative_to(repo).as_posix())
        if fields.get("twin") and fields["twin"] not in twins:
            twins.append(fields["twin"])
    for cheats, twins in found.values():
        twins.sort()
    return found
