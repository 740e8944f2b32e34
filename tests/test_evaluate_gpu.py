"""The evaluator on a CUDA device: an honest CuTe candidate passes with timing against the baselines
and a speed-of-light fraction; GPU faults (a kernel that never ends, an illegal address, a host-side
segfault, device OOM, a build that hangs) end in clear verdicts and the next evaluation passes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cutegen.config import EvalConfig, RuntimeConfig
from cutegen.evaluate.clock import RETRY_BATCHES
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.service import Evaluator
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
SWISH_TASK = REPO / "examples" / "tasks" / "swish_scale.py"
SWISH_CUTE = REPO / "examples" / "candidates" / "swish_scale_cute.py"
FAULTS = REPO / "tests" / "fixtures" / "faults"

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
                      timing_trials=30, compile_baseline=False, run_timeout_s=60.0, build_timeout_s=120.0)


def test_honest_cute_candidate_passes_with_timing_and_speed_of_light(service, config):
    verdict = evaluate_candidate(SWISH_CUTE, load_task(SWISH_TASK), config, service)
    assert verdict.passed, verdict.feedback
    # 30 timed calls, and RETRY_BATCHES more batches where a shared GPU disturbed the parent's clock
    assert verdict.stage == "timing"
    assert verdict.timing.trials in (30, 30 + RETRY_BATCHES * min(30, config.timed_batch_calls))
    assert verdict.errors.max_abs_error <= 1e-4
    names = {c.name: c for c in verdict.checks}
    assert names["disallowed_ops"].passed and names["audit_kernels"].passed
    assert "swish" in names["audit_kernels"].detail
    assert verdict.eager is not None and verdict.speedup_vs_eager > 0.5
    assert 0.0 < verdict.sol_fraction <= 1.0 + config.sol_slack
    # The second candidate of the task finds its reference ready: no reference step, a shorter hold
    again = evaluate_candidate(SWISH_CUTE, load_task(SWISH_TASK), config, service)
    assert again.passed, again.feedback
    assert "reference" not in dict(again.stage_s) and "reference" in dict(verdict.stage_s)


@pytest.mark.parametrize("name, failure", [
    ("kernel_hang", "run_timeout"),
    ("illegal_address", "illegal_memory_access"),
    ("host_segfault", "worker_crashed"),
    ("device_oom", "out_of_memory"),
    ("build_hang", "build_timeout"),
])
def test_gpu_faults_end_in_a_clear_verdict_and_the_next_evaluation_passes(name, failure, service, config):
    faulty = replace(config, do_timing=False, run_timeout_s=20.0, build_timeout_s=20.0)
    verdict = evaluate_candidate(FAULTS / f"{name}.py", load_task(SWISH_TASK), faulty, service)
    assert not verdict.passed and verdict.failure == failure, verdict.feedback
    after = evaluate_candidate(SWISH_CUTE, load_task(SWISH_TASK), replace(config, do_timing=False), service)
    assert after.passed, after.feedback


def _matmuls(a):
    """About 10 ms of cuBLAS work on the current stream (TF32 off: fp32 SIMT)."""
    out = a
    for _ in range(4):
        out = a @ a
    return out


def test_timing_takes_the_stream_time_and_counts_work_left_on_another_stream():
    import statistics

    import torch

    from cutegen.evaluate.timing import hidden_work_trials, time_forward

    x = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def hidden(a):  # the same work on a stream the caller's end event does not wait for
        with torch.cuda.stream(side):
            out = _matmuls(a)
        return out

    honest = time_forward(_matmuls, [[x]], device=torch.device("cuda"), trials=8, warmup=2)
    cheat = time_forward(hidden, [[x]], device=torch.device("cuda"), trials=8, warmup=2)
    # The honest calls may be timed to the idle device (the host wakes up late from a 10 ms
    # synchronize: on the H200 all 8 were), but only the hidden ones count as hidden work.
    assert hidden_work_trials(honest.stream_ms, honest.idle_ms, honest.idle_limit_ms) <= 1
    assert cheat.past_stream == 8 and hidden_work_trials(cheat.stream_ms, cheat.idle_ms, cheat.idle_limit_ms) == 8
    # On the stream, the end event comes before the synchronize's latency; off it, the device-wide
    # wait is what counts, so the hidden work is still charged in full.
    assert all(t <= i for t, i in zip(honest.times_ms, honest.idle_ms))
    assert statistics.median(cheat.times_ms) >= 0.9 * statistics.median(honest.times_ms)
