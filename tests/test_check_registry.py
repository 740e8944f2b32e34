"""The registry of checks (cutegen.evaluate.checks) against what the evaluator emits, the fixtures that
prove each check, and EVALUATION.md's table of classes, checks and fixtures.

- Every check name the evaluator's source can put in a verdict is registered: the string literals
  passed as the name to `fail`, `CheckResult`, `Finding`, a worker's death (`_died`, `timeout_reason`),
  `note_run`, a `{"check": ...}` finding, an assignment to `.failure`, the static check functions and
  the names `error_failure` gives each kind of worker error. The scan must find the names it is known
  to find, so that a scan that finds nothing cannot pass.
- Every registered name is emitted somewhere (no stale entries), except those listed as NOT_EMITTED.
- Every fixture's `caught-by` is registered (or `none`, with a twin); every defence states its exploit
  in one line and has a cheat fixture (except those listed as AWAITING_FIXTURE, with the reason).
- The static and dynamic backend tables are the registry's.
- A failed verdict names a registry entry, and its JSON lists the checks that ran.
- EVALUATION.md's table puts every cheat fixture under the check its header names, and every defence
  in some row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cutegen.config import EvalConfig
from cutegen.evaluate import anticheat, checks_static
from cutegen.evaluate.checks import (
    BY_NAME, CHECKS, DEFENCE, KINDS, NO_CHECK, OBSERVERS, check, defences, static_check_names,
)
from cutegen.evaluate.verdict import error_failure
from cutegen.records import to_json

from fixture_headers import fixtures_by_check, header

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "cutegen"
CHEATS = sorted((REPO / "tests" / "fixtures" / "cheats").glob("[0-9][0-9]_*.py"))

# Calls whose first argument (every argument, for note_run) is a check name when it is a literal.
NAME_FIRST = {"fail", "CheckResult", "Finding", "_died", "WorkerDied"}
NAME_KEYWORDS = {"check", "timeout_reason"}
# Registered but not emitted by any code yet: the infrastructure verdict a poisoned environment would
# give (today an evaluation there raises EnvironmentPoisoned before any verdict exists).
NOT_EMITTED = {"environment_poisoned"}
# Defences without a cheat fixture yet, and why.
AWAITING_FIXTURE = {
    "below_output_floor": "a cheat must get past the parent's clock first (a forgery under its margin on a"
                          " write-bound task) to reach it: a GPU fixture, not written yet",
}


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _literals(node: ast.AST) -> list[str]:
    """The string literals an argument can evaluate to: itself, or those of a starred list, a tuple or
    either branch of a conditional (not its condition)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Starred):
        return _literals(node.value)
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [s for e in node.elts for s in _literals(e)]
    return []


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _names_in(tree: ast.AST) -> set[str]:
    """The check names emitted as literals in one module (the patterns of the module docstring)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "note_run":
                found.update(s for arg in node.args for s in _literals(arg))
            elif name in NAME_FIRST and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
            found.update(k.value.value for k in node.keywords if k.arg in NAME_KEYWORDS
                         and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str))
        elif isinstance(node, ast.Dict):
            found.update(v.value for k, v in zip(node.keys, node.values)
                         if isinstance(k, ast.Constant) and k.value == "check"
                         and isinstance(v, ast.Constant) and isinstance(v.value, str))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults \
                + node.args.kw_defaults
            found.update(d.value for a, d in zip(args, defaults) if a.arg == "timeout_reason"
                         and isinstance(d, ast.Constant) and isinstance(d.value, str))
        elif isinstance(node, ast.Assign):
            found.update(_failure_assignments(node))
    return found


def _failure_assignments(node: ast.Assign) -> set[str]:
    """`run.failure = "x"` and `run.failure, run.feedback = "x", ...`."""
    found = set()
    for target in node.targets:
        unpacked = isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
        pairs = zip(target.elts, node.value.elts) if unpacked else [(target, node.value)]
        found.update(v.value for t, v in pairs if isinstance(t, ast.Attribute) and t.attr == "failure"
                     and isinstance(v, ast.Constant) and isinstance(v.value, str))
    return found


def _error_kinds() -> set[str]:
    """The kinds failure.classify_error gives a worker's exception (its returned literals and the
    CUDA kinds), plus the kinds a death carries into a build reply."""
    tree = ast.parse((SRC / "evaluate" / "failure.py").read_text())
    kinds: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "classify_error":
            kinds.update(s for r in ast.walk(node) if isinstance(r, ast.Return) for s in _strings(r))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_CUDA_KINDS" for t in node.targets):
            kinds.update(e.elts[0].value for e in node.value.elts)
    return kinds


def emitted_names() -> set[str]:
    found: set[str] = set()
    for path in sorted(SRC.rglob("*.py")):
        found |= _names_in(ast.parse(path.read_text(), filename=str(path)))
    found |= {c.__name__ for c in checks_static.STATIC_CHECKS} | {"run_static_checks"}
    for kind in _error_kinds():
        for stage in ("build", "correctness", "timing"):
            found.add(error_failure({"kind": kind, "type": "E", "message": "m"}, stage)[0])
    return found


EMITTED = emitted_names()


def test_the_scan_finds_the_names_it_is_known_to_find():
    """Each pattern of the scan finds at least the name it was written for."""
    assert {"gpu_busy", "parent_clock", "timed_outputs", "below_output_floor", "beat_work_bound",  # CheckResult / fail
            "worker_crashed", "worker_protocol", "run_timeout", "build_timeout",  # _died / timeout_reason
            "check_nonfinite", "check_output_types",  # {"check": ...} findings
            "guard_refused", "write_outside_scratch", "out_of_memory", "illegal_memory_access", "import_error",
            "runtime_error",  # error_failure
            "check_uses_cute", "run_static_checks"} <= EMITTED
    assert len(EMITTED) >= 40


def test_every_name_the_evaluator_emits_is_registered():
    unregistered = sorted(EMITTED - set(BY_NAME))
    assert not unregistered, f"add these to cutegen/evaluate/checks.py: {unregistered}"


def test_every_registered_name_is_emitted():
    stale = set(BY_NAME) - EMITTED
    assert stale <= NOT_EMITTED, f"registered, but no code emits them: {sorted(stale - NOT_EMITTED)}"
    assert NOT_EMITTED <= set(BY_NAME)


def test_entries_are_complete_and_unique():
    assert len(BY_NAME) == len(CHECKS), "each name once"
    for entry in CHECKS:
        assert entry.kind in KINDS and entry.observes in OBSERVERS, entry.name
        assert entry.judges and "\n" not in entry.judges, entry.name
        assert entry.backends and entry.backends <= {"cute", "cuda", "torch"}, entry.name
        assert all(name in BY_NAME for name in entry.reported_as), entry.name
        if entry.kind == DEFENCE:
            assert entry.exploit and "\n" not in entry.exploit, f"{entry.name}: a defence states its exploit, in a line"
        else:
            assert not entry.exploit, f"{entry.name}: only a defence has an exploit"
    with pytest.raises(KeyError, match="checks.py"):
        check("no_such_check")


def test_every_fixture_is_caught_by_a_registered_check():
    for path in CHEATS:
        fields = header(path)
        named = fields.get("caught-by")
        assert named in BY_NAME or named == NO_CHECK, f"{path.name}: caught-by {named!r} is not registered"
        if named == NO_CHECK:
            assert fields.get("twin"), f"{path.name}: a cheat the protocol lets pass is measured against its twin"
        else:
            assert BY_NAME[named].kind == DEFENCE, f"{path.name}: {named} is not a defence"


def test_every_defence_has_a_cheat_fixture():
    by_check = fixtures_by_check(REPO)
    missing = {entry.name for entry in defences() if not by_check.get(entry.name, ([], []))[0]}
    awaiting = set(AWAITING_FIXTURE)
    assert missing == awaiting, f"no cheat fixture, or AWAITING_FIXTURE out of date: {sorted(missing ^ awaiting)}"
    for cheats, twins in by_check.values():
        assert all((REPO / twin).is_file() for twin in twins)


def test_the_backend_tables_are_the_registrys():
    assert tuple(c.__name__ for c in checks_static.STATIC_CHECKS) == static_check_names()
    assert checks_static.STATIC_CHECK_BACKENDS == {name: BY_NAME[name].backends for name in static_check_names()}
    assert checks_static.STATIC_CHECK_BACKENDS["check_uses_cute"] == {"cute"}
    dynamic = anticheat.DYNAMIC_CHECK_BACKENDS
    assert dynamic == {name: BY_NAME[name].backends for name in dynamic}
    assert anticheat.DYNAMIC_CHECK_BACKENDS["disallowed_ops"] == {"cute", "cuda"}


@pytest.mark.parametrize("fixture, backend", [("10_subclass_model.py", "torch"), ("25_no_cute.py", "cute")])
def test_a_failed_verdict_names_a_registry_entry_and_lists_what_ran(tmp_path, fixture, backend):
    """Through the whole pipeline (rejected at the static stage, so nothing runs): the failure is the
    fixture's registered check, and the JSON lists every static check of the backend as run."""
    from cutegen.evaluate.pipeline import evaluate_candidate
    from cutegen.tasks import load_task

    path = REPO / "tests" / "fixtures" / "cheats" / fixture
    config = EvalConfig(device="cpu" if backend == "torch" else "cuda", backend=backend, cache_dir=tmp_path)
    verdict = evaluate_candidate(path, load_task(REPO / "examples" / "tasks" / "swish_scale.py"), config)
    assert not verdict.passed and verdict.failure == header(path)["caught-by"]
    assert check(verdict.failure).kind == DEFENCE
    ran = to_json(verdict)["checks_run"]
    assert ran == [c.__name__ for c in checks_static.static_checks_for(backend)]
    assert ("check_uses_cute" in ran) == (backend == "cute")


def test_an_honest_verdict_lists_every_check_that_judged_it(tmp_path):
    """A whole CPU evaluation, timed: `checks_run` holds the checks that record nothing when they pass
    (each static check, the reply protocol, the audit hook, global state, the output contract) beside
    those in `checks`, all registered, and survives the JSON round trip."""
    from cutegen.evaluate.pipeline import evaluate_candidate
    from cutegen.records import Verdict, from_json
    from cutegen.tasks import load_task

    config = EvalConfig(device="cpu", backend="torch", cache_dir=tmp_path, timing_trials=10, compile_baseline=False)
    verdict = evaluate_candidate(REPO / "tests" / "fixtures" / "honest" / "swish_scale.py",
                                 load_task(REPO / "examples" / "tasks" / "swish_scale.py"), config)
    assert verdict.passed, verdict.feedback
    ran = list(verdict.checks_run)
    assert set(ran) <= set(BY_NAME) and {c.name for c in verdict.checks} <= set(ran)
    assert {"check_no_patching", "worker_protocol", "guard_refused", "global_state_changes", "new_threads",
            "check_output_types", "inputs_mutated", "check_nonfinite", "timed_outputs", "parent_clock"} <= set(ran)
    assert not {"check_forward_allowlist", "disallowed_ops", "churn_free_memory"} & set(ran)  # torch, on a CPU
    assert ran.index("check_no_patching") < ran.index("worker_protocol") < ran.index("compare_outputs") \
        < ran.index("parent_clock")
    assert from_json(Verdict, to_json(verdict)).checks_run == verdict.checks_run


# ---------------------------------------------------------------------------------- EVALUATION.md


def _table_rows() -> list[tuple[set[str], set[int]]]:
    """(check names, fixture numbers) of each row of EVALUATION.md's table of classes."""
    text = (REPO / "EVALUATION.md").read_text()
    section = text.split("## Classes, checks and fixtures", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not line.startswith("|") or set(cells[0]) <= {"-", " "} or cells[0] == "class":
            continue
        names = set(re.findall(r"`([a-z0-9_]+)`", cells[1]))
        numbers: set[int] = set()
        for low, high in re.findall(r"\b(\d{2})(?:-(\d{2}))?\b", cells[3]):
            numbers.update(range(int(low), int(high or low) + 1))
        rows.append((names, numbers))
    return rows


def test_evaluation_md_puts_every_fixture_under_its_check():
    rows = _table_rows()
    assert rows, "EVALUATION.md has the table of classes, checks and fixtures"
    by_number = {int(p.name[:2]): header(p)["caught-by"] for p in CHEATS}
    listed: set[int] = set()
    for names, numbers in rows:
        assert names <= set(BY_NAME) | {NO_CHECK}, f"unregistered names in the table: {names - set(BY_NAME)}"
        for number in numbers:
            assert number in by_number, f"EVALUATION.md lists fixture {number}, which does not exist"
            assert by_number[number] in names, f"fixture {number} is caught by {by_number[number]}, not {names}"
        listed |= numbers
    assert listed == set(by_number), f"fixtures missing from EVALUATION.md: {sorted(set(by_number) - listed)}"
    named = set().union(*(names for names, _ in rows))
    unlisted = {entry.name for entry in defences()} - named
    assert not unlisted, f"defences missing from EVALUATION.md's table: {sorted(unlisted)}"


def test_evaluation_md_has_the_sections_the_source_cites():
    """A docstring that cites EVALUATION.md, "Section" names a heading that exists."""
    headings = {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", (REPO / "EVALUATION.md").read_text(), re.M)}
    cited = set()
    for path in SRC.rglob("*.py"):
        cited |= set(re.findall(r'EVALUATION\.md,\s+"([^"]+)"', path.read_text()))
    assert cited, "the scan finds the citations"
    assert cited <= headings, f"cited sections missing from EVALUATION.md: {sorted(cited - headings)}"
