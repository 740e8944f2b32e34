"""Every judge fixture on a CUDA device, under every backend it applies to, through the evaluator as a
user's evaluation runs it.

- Each cheat of tests/fixtures/cheats/ is rejected by the check its `# caught-by:` names (or by one its
  named check works through, EQUIVALENT), or by an earlier check, which the table says. A cheat the
  judge lets pass (`caught-by: none`, or a timing cheat whose gain the clocks took away) must have an
  honest `# twin:` and be timed no faster than it. `layer: timing` and `layer: guard-off` fixtures are judged with timing
  on, the guard-off ones with the in-process audit hook off, so they reach the layer they test.
- Each honest fixture and example candidate is accepted (no false positive), timed.
- With a KernelBench checkout: the plain-CUDA candidates of bench/candidates/cuda/ (backend cuda) and
  the structure candidates of bench/candidates/structure/ are accepted.

The selected cases are judged side by side, as a run's candidates are (each builds in the CPU pool
while others hold the GPU). Rows go to fixtures-gpu.{json,md} in the results folder (--results-dir).
The GPU faults are tests/test_evaluate_gpu.py's. The outcome rule itself is tested on the CPU below.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from cutegen.config import EvalConfig, RuntimeConfig
from cutegen.evaluate.checks import CHECKS
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.service import Evaluator
from cutegen.tasks import load_task, load_tasks
from fixture_headers import backends, header, task_path
from results_table import ResultsTable

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# A check that works by making another one fire (churned memory shows up as NaN or wrong values): the
# registry's `reported_as`.
EQUIVALENT = {entry.name: set(entry.reported_as) for entry in CHECKS if entry.reported_as}
TWIN_MARGIN = 0.9  # a passing cheat may be at most 10% faster than its twin (timing noise)


@dataclass(frozen=True)
class Case:
    """One evaluation: the file, the backend, what it must get (a check's name, `pass`, or `none`: a cheat
    that may pass no faster than its twin), its layer and twin, and the KernelBench task when it has one."""

    file: Path
    backend: str
    expected: str
    layer: str = ""
    twin: str | None = None
    kernelbench: str | None = None  # "level1/19" for bench/candidates files

    @property
    def id(self) -> str:
        return f"{self.file.parent.name}/{self.file.stem}[{self.backend}]"


def _local_cases() -> list[Case]:
    cases = []
    for path in sorted((FIXTURES / "cheats").glob("*.py")):
        fields = header(path)
        cases += [Case(path, backend, fields["caught-by"], fields.get("layer", ""), fields.get("twin"))
                  for backend in backends(path)]
    honest = sorted((FIXTURES / "honest").glob("*.py")) + sorted((REPO / "examples" / "candidates").glob("*.py"))
    return cases + [Case(path, backend, "pass") for path in honest for backend in backends(path)]


def _kernelbench_cases() -> list[Case]:
    cases = []
    for folder, backend in (("cuda", "cuda"), ("structure", "torch")):
        for path in sorted((REPO / "bench" / "candidates" / folder).glob("level_*.py")):
            level, problem = re.match(r"level_(\d+)_problem_(\d+)_", path.name).groups()
            cases.append(Case(path, header(path).get("backend", backend), "pass", kernelbench=f"level{level}/{problem}"))
    return cases


LOCAL, KERNELBENCH = _local_cases(), _kernelbench_cases()


def outcome(row: dict[str, Any], twin: dict[str, Any] | None) -> str:
    """OK when the verdict is the expected one ("OK (earlier: X)" when another check rejected a cheat
    first). A cheat that passes is OK only when it has a twin and is timed no faster than it
    (TWIN_MARGIN): the `none` ones always may, and a timing cheat may where the clocks took its gain
    (a driver-API stream timed to the idle device). Anything else says what went wrong."""
    if row.get("error"):
        return "ERROR"
    if row["expected"] == "pass":
        return "OK" if row["passed"] else "NOT-OK"
    if row["passed"]:
        if twin is None:
            return "NOT-OK"
        if not twin.get("median_ms") or not row.get("median_ms"):
            return "NOT-OK (twin not measured)"
        return "OK (no faster than its twin)" if row["median_ms"] >= TWIN_MARGIN * twin["median_ms"] else "NOT-OK"
    if row["expected"] == "none":
        return f"OK (rejected: {row['failure']})"
    if row["expected"] in (row["failure"], *row["fired"]) or row["failure"] in EQUIVALENT.get(row["expected"], ()):
        return "OK"
    return f"OK (earlier: {row['failure']})"


def _config_for(case: Case, base: EvalConfig) -> EvalConfig:
    """Timing where the verdict needs it: honest files (their speed is reported), cheats that act in the
    timing stage or behind the audit hook, and cheats that may pass (compared with their twin)."""
    timed = case.expected in ("pass", "none") or case.layer in ("timing", "guard-off")
    return replace(base, backend=case.backend, do_timing=timed, guard=case.layer != "guard-off")


def judge(case: Case, base: EvalConfig, service: Evaluator, kernelbench: Path | None = None) -> dict[str, Any]:
    """One evaluation as a table row; an exception is the row's error, not the run's end."""
    started = time.perf_counter()
    row: dict[str, Any] = {"case": case.id, "backend": case.backend, "expected": case.expected,
                           "layer": case.layer or "-", "twin": case.twin}
    try:
        task = (load_tasks(kernelbench, case.kernelbench)[0] if case.kernelbench
                else load_task(task_path(case.file, REPO)))
        verdict = evaluate_candidate(case.file, task, _config_for(case, base), service)
    except Exception as err:  # noqa: BLE001 - a row of the table, not a crash of the whole run
        return {**row, "error": f"{type(err).__name__}: {err}"[:800], "passed": None}
    fired = [c.name for c in verdict.checks if not c.passed]
    fired += [f.check for c in verdict.checks if not c.passed for f in getattr(c, "findings", ())]
    return {**row, "passed": verdict.passed, "failure": verdict.failure, "stage": verdict.stage, "fired": fired,
            "median_ms": verdict.timing.median_ms if verdict.timing else None,
            "parent_clock_ratio": getattr(verdict, "parent_clock_ratio", None), "gpu_s": verdict.gpu_s,
            "speedup_vs_eager": verdict.speedup_vs_eager, "sol_fraction": verdict.sol_fraction,
            "feedback": verdict.feedback[:400], "s": round(time.perf_counter() - started, 2)}


# ------------------------------------------------------------------------------------------ on the GPU


@pytest.fixture(scope="module")
def service():
    with Evaluator("cuda") as shared:
        yield shared


@pytest.fixture(scope="module")
def base_config(tmp_path_factory, shared_build_cache) -> EvalConfig:
    pytest.importorskip("cutlass_library")
    return EvalConfig(device="cuda", cache_dir=tmp_path_factory.mktemp("eval") / "eval", timing_trials=30,
                      runtime=RuntimeConfig(cache_dir=shared_build_cache), compile_baseline=False,
                      run_timeout_s=120.0, build_timeout_s=180.0)


@pytest.fixture(scope="module")
def table(results_dir) -> ResultsTable:
    return ResultsTable(results_dir, "fixtures-gpu", "Every judge fixture on the GPU, under each of its backends",
                        ["case", "backend", "layer", "expected", "passed", "failure", "median_ms", "parent_clock_ratio",
                         "outcome", "s"])


@pytest.fixture(scope="module")
def judged(request, service, base_config, table) -> dict[str, dict[str, Any]]:
    """The rows of every local case this session selected, and the twins they need, judged side by side."""
    params = [getattr(getattr(item, "callspec", None), "params", {}) for item in request.session.items
              if item.module is request.module]
    wanted = {p["case"].id for p in params if "case" in p}
    cases = [c for c in LOCAL if c.id in wanted]
    twins = {(REPO / c.twin, c.backend) for c in cases if c.twin}
    cases += [c for c in LOCAL if (c.file, c.backend) in twins and c.id not in wanted]
    with ThreadPoolExecutor(len(service.lanes) + service.build_jobs) as pool:
        rows = dict(zip([c.id for c in cases], pool.map(lambda c: judge(c, base_config, service), cases)))
    for case in cases:
        twin = rows.get(Case(REPO / case.twin, case.backend, "pass").id) if case.twin else None
        rows[case.id]["outcome"] = outcome(rows[case.id], twin)
        table.add(rows[case.id])
    return rows


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", LOCAL, ids=lambda c: c.id)
def test_each_fixture_gets_its_verdict_on_the_gpu(case, judged):
    row = judged[case.id]
    assert row["outcome"].startswith("OK"), (row["outcome"], row.get("failure"), row.get("error"), row.get("feedback"))


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.kernelbench
@pytest.mark.parametrize("case", KERNELBENCH, ids=lambda c: c.id)
def test_each_kernelbench_candidate_is_accepted(case, service, base_config, kernelbench_root, table):
    row = judge(case, base_config, service, kernelbench_root)
    row["outcome"] = outcome(row, None)
    table.add(row)
    assert row["outcome"] == "OK", (row.get("failure"), row.get("error"), row.get("feedback"))


# ------------------------------------------------------------------------------- the rule, on the CPU


def _row(expected: str, passed: bool, failure: str | None = None, fired=(), median_ms=None) -> dict[str, Any]:
    return {"expected": expected, "passed": passed, "failure": failure, "fired": list(fired), "median_ms": median_ms}


def test_a_cheat_is_ok_only_when_rejected_and_named_checks_count():
    assert outcome(_row("compare_outputs", False, "compare_outputs"), None) == "OK"
    assert outcome(_row("ghost_probe", False, "determinism", fired=["determinism", "ghost_probe"]), None) == "OK"
    assert outcome(_row("churn_free_memory", False, "check_nonfinite"), None) == "OK"
    assert outcome(_row("audit_kernels", False, "disallowed_ops"), None) == "OK (earlier: disallowed_ops)"
    assert outcome(_row("audit_kernels", True), None) == "NOT-OK"  # the adversarial fixture passed: caught here
    assert outcome(_row("pass", True), None) == "OK" and outcome(_row("pass", False, "build_error"), None) == "NOT-OK"


def test_a_cheat_that_passes_must_be_no_faster_than_its_twin():
    twin = {"median_ms": 1.0}
    assert outcome(_row("none", True, median_ms=0.95), twin) == "OK (no faster than its twin)"
    assert outcome(_row("none", True, median_ms=0.5), twin) == "NOT-OK"  # the cheat's gain survived the clocks
    assert outcome(_row("none", True, median_ms=0.5), {"median_ms": None}) == "NOT-OK (twin not measured)"
    assert outcome(_row("none", False, "parent_clock"), twin) == "OK (rejected: parent_clock)"
    # A timing cheat the clocks made worthless may pass beside its twin; without a twin it may not.
    assert outcome(_row("work_past_stream", True, median_ms=1.2), twin) == "OK (no faster than its twin)"
    assert outcome(_row("work_past_stream", True, median_ms=0.2), twin) == "NOT-OK"
    assert outcome(_row("work_past_stream", True, median_ms=1.2), None) == "NOT-OK"


def test_every_fixture_names_a_task_and_a_twin_that_exist():
    for case in LOCAL:
        assert task_path(case.file, REPO).is_file(), case.id
        if case.twin:
            assert (REPO / case.twin).is_file() and any(c.file == REPO / case.twin for c in LOCAL), case.id
        if case.expected == "none":
            assert case.twin, f"{case.id}: a cheat that may pass needs a twin to be compared with"
    assert {c.backend for c in KERNELBENCH} == {"cuda", "cute", "torch"} and all(c.kernelbench for c in KERNELBENCH)
    # An example names its task in its docstring (the file name alone would miss these three).
    examples = {p.name: task_path(p, REPO).stem for p in (REPO / "examples" / "candidates").glob("*.py")}
    assert examples["gemm_bf16_wgmma.py"] == "matmul_bf16" and examples["matmul_3xtf32_cute.py"] == "matmul"
    assert examples["conv2d_implicit_gemm_cute.py"] == "conv2d"


def test_judge_makes_the_rows_the_table_needs_on_the_cpu(tmp_path):
    """judge() end to end on torch-backend files (the CPU evaluates them): an honest file and a cheat
    each get their outcome, and the table holds both rows with the manifest."""
    honest = Case(FIXTURES / "honest" / "swish_scale.py", "torch", "pass")
    cheat = Case(FIXTURES / "cheats" / "30_nan_output.py", "torch", "check_nonfinite")
    config = EvalConfig(device="cpu", backend="torch", cache_dir=tmp_path / "eval", timing_trials=3,
                        correctness_trials=1, compile_baseline=False)
    table = ResultsTable(tmp_path, "judged", "judged on the CPU", ["case", "outcome"])
    with Evaluator("cpu") as service:
        for case in (honest, cheat):
            row = judge(case, config, service)
            row["outcome"] = outcome(row, None)
            table.add(row)
    assert [r["outcome"] for r in table.rows] == ["OK", "OK"], [r.get("feedback") or r.get("error") for r in table.rows]
    assert table.rows[0]["median_ms"] > 0 and table.rows[1]["failure"] == "check_nonfinite"
    text = (tmp_path / "judged.md").read_text()
    assert "| honest/swish_scale[torch] | OK |" in text and "| cheats/30_nan_output[torch] | OK |" in text
