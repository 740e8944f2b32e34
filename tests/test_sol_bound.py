"""The reference algorithm's work bound is a bound: no eager or torch.compile time of the 200 KernelBench
level 1 and 2 baselines measured on the H200 (bench/results/baselines-h200.json) is faster than it,
while the bound at the measured peaks alone (the achievable bound) is beaten by 31 of them.

bench/sol_bound_check.py computes the table kept in bench/results/sol-bound-check.md."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASELINES = REPO / "bench" / "results" / "baselines-h200.json"


@pytest.fixture(scope="session")
def check():
    spec = importlib.util.spec_from_file_location("sol_bound_check_under_test", REPO / "bench" / "sol_bound_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def state() -> dict:
    return json.loads(BASELINES.read_text())


def test_no_baseline_is_faster_than_its_work_bound(check, state):
    rows = check.check_rows(state)
    assert len(state["tasks"]) == 200 and {e["level"] for e in state["tasks"].values()} == {1, 2}
    assert len(rows) == 400 and all(r["work_bound_ms"] and r["eager_ms"] and r["compiled_ms"] for r in rows)
    assert [r for r in rows if r["work_fraction"] > 1.0] == []
    assert max(r["work_fraction"] for r in rows) == pytest.approx(0.9396, abs=1e-4)  # level1/96 under torch.compile
    # The achievable bound (measured peaks) is no limit: torch.compile's loss reductions beat it.
    past = {(r["task_id"], r["track"]) for r in rows if r["achievable_fraction"] > 1.0}
    assert len(past) == 31 and ("level1/94", "fp32") in past


def test_a_time_under_the_work_bound_is_caught(check, state):
    """The check's adversarial twin: the same table with level1/94's torch.compile time set 5% under
    its work bound (a wrong FLOP or byte count, or a peak set too low, would read so)."""
    forged = copy.deepcopy(state)
    honest = next(r for r in check.check_rows(state) if (r["task_id"], r["track"]) == ("level1/94", "fp32"))
    assert honest["achievable_fraction"] > 1.0 > honest["work_fraction"]  # torch.compile-class, under 100%
    forged["tasks"]["level1/94"]["tracks"]["fp32"]["compiled"]["median_ms"] = honest["work_bound_ms"] * 0.95
    rows = check.check_rows(forged)
    assert [(r["task_id"], r["track"]) for r in rows if r["work_fraction"] > 1.0] == [("level1/94", "fp32")]
    assert "| eager or torch.compile faster than the work bound | **1** |" in check.markdown(forged, rows, False)


@pytest.mark.kernelbench
def test_the_bounds_hold_with_this_checkouts_traces(check, state, kernelbench_root):
    rows = check.check_rows(state, check.current_traces(kernelbench_root, state))
    assert [r["stale"] for r in rows if r["stale"]] == []
    assert [r for r in rows if r["work_fraction"] > 1.0] == []


def test_the_kept_table_says_what_the_check_finds(check, state):
    kept = (REPO / "bench" / "results" / "sol-bound-check.md").read_text()
    assert "| task-track pairs checked | 400 |" in kept
    assert "| eager or torch.compile faster than the work bound | **0** |" in kept
    rows = check.check_rows(state)
    table = check.markdown(state, rows, traced=True)
    assert table.split("## The closest")[1] == kept.split("## The closest")[1]
