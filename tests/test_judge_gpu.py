"""The timing stage's defences on a CUDA device: work hidden on a driver-API stream, a persisting-L2
window, a forged record of GPU times (caught by the parent's clock), an honest slow kernel whose two
clocks agree, and a kernel under the reference's work bound judged by the strongest verification."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cutegen.config import EvalConfig, RuntimeConfig
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.service import Evaluator
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
CHEATS = REPO / "tests" / "fixtures" / "cheats"
HONEST = REPO / "tests" / "fixtures" / "honest"
SWISH = REPO / "examples" / "tasks" / "swish_scale.py"
STRUCTURE = REPO / "bench" / "candidates" / "structure"

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]


@pytest.fixture(scope="module")
def service():
    with Evaluator("cuda") as shared:
        yield shared


@pytest.fixture(scope="module")
def config(tmp_path_factory, shared_build_cache):
    pytest.importorskip("cutlass_library")
    root = tmp_path_factory.mktemp("eval")
    return EvalConfig(device="cuda", cache_dir=root / "eval", runtime=RuntimeConfig(cache_dir=shared_build_cache),
                      timing_trials=50, compile_baseline=False, run_timeout_s=120.0, build_timeout_s=180.0)


def test_an_honest_slow_kernel_is_accepted_with_the_two_clocks_agreeing(service, config):
    verdict = evaluate_candidate(HONEST / "cute_slow_swish_scale.py", load_task(SWISH), config, service)
    assert verdict.passed, verdict.feedback
    assert verdict.timing.median_ms > 1.0
    assert 0.8 < verdict.parent_clock_ratio < 1.25, verdict.parent_clock_ratio


def test_a_forged_record_of_gpu_times_is_caught_by_the_parents_clock(service, config):
    verdict = evaluate_candidate(CHEATS / "57_gpu_forged_record.py", load_task(SWISH), replace(config, guard=False),
                                 service)
    assert not verdict.passed and verdict.failure == "parent_clock", verdict.feedback
    assert verdict.parent_clock_ratio > 3.0


def test_work_on_a_driver_api_stream_is_seen_by_the_device_wide_wait(service, config):
    verdict = evaluate_candidate(CHEATS / "55_driver_api_stream.py", load_task(SWISH), config, service)
    twin = evaluate_candidate(HONEST / "cute_slow_swish_scale.py", load_task(SWISH), config, service)
    assert twin.passed, twin.feedback
    if verdict.passed:  # timed to the idle device: no faster than the same kernel on the given stream
        assert verdict.timing.median_ms >= 0.9 * twin.timing.median_ms
    else:  # seen on the H200: its stream does not wait for the inputs drawn on the given one, so it
        # reads them half-written and the correctness calls already fail
        assert verdict.failure in ("work_past_stream", "compare_outputs"), verdict.feedback


def test_a_persisting_l2_window_buys_nothing_across_the_flush(service, config):
    verdict = evaluate_candidate(CHEATS / "56_persisting_l2.py", load_task(SWISH), config, service)
    twin = evaluate_candidate(HONEST / "cute_swish_scale.py", load_task(SWISH), config, service)
    assert verdict.passed and twin.passed, (verdict.feedback, twin.feedback)
    assert verdict.timing.median_ms >= 0.9 * twin.timing.median_ms


@pytest.mark.kernelbench
@pytest.mark.parametrize("name, backend", [("level_1_problem_14_triangular_tiles.py", "torch"),
                                           ("level_1_problem_14_triangular_3xtf32_cute.py", "cute")])
def test_a_kernel_under_the_reference_work_bound_is_verified_and_accepted_with_the_note(service, config,
                                                                                      kernelbench_root, name,
                                                                                      backend):
    """KernelBench level1/14 (products of upper-triangular matrices): skipping the zero blocks needs
    about a fifth of the dense product's work, so an honest kernel can beat the dense bound. Whether
    it does is measured by bench/judge_h200.py; here, that it passes, and carries the note if it did."""
    task = load_task(next((kernelbench_root / "level1").glob("14_*.py")))
    verdict = evaluate_candidate(STRUCTURE / name, task, replace(config, backend=backend), service)
    assert verdict.passed, verdict.feedback
    if verdict.beat_work_bound:
        names = {c.name: c for c in verdict.checks}
        assert names["beat_work_bound"].passed and "verified" in names["beat_work_bound"].detail
        assert "work bound" in verdict.feedback
