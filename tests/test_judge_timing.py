"""The timing stage's own defences on the CPU: the parent's clock on each timed batch (clock.py), the
timed calls verified on inputs of their own after each batch, and an ended worker."""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from cutegen.config import EvalConfig
from cutegen.evaluate.clock import (
    MEAN_FLOOR_SHARE,
    BatchClock,
    clock_ratio,
    counted_times,
    judge_parent_clock,
    overhead_per_call_ms,
)
from cutegen.evaluate.messages import (
    AnticheatReply, BuildReply, CalibrationReply, DeterminismReply, ExportReply, GhostRunReply, KernelAuditReply,
    ReplyMalformed, TimedBatchReply, TrialReply,
    WarmupReply, WeightsReply,
)
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.service import Evaluator
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
CHEATS = REPO / "tests" / "fixtures" / "cheats"
HONEST = REPO / "tests" / "fixtures" / "honest"
SWISH = REPO / "examples" / "tasks" / "swish_scale.py"


# ------------------------------------------------------------------------------ the rule alone


def _calibration(overhead_ms: float, calls: int = 10) -> list[BatchClock]:
    # Three batches of a null forward: 1 us reported per call, the rest is the loop's own cost
    # (the machine's other work only adds to it: the smallest is taken).
    return [BatchClock(calls, calls * (overhead_ms + extra + 0.001), calls * 0.001) for extra in (0.0, 0.3, 0.1)]


def test_the_calibrated_overhead_is_the_least_the_loop_cost():
    assert overhead_per_call_ms(_calibration(0.2)) == pytest.approx(0.2)


@pytest.mark.parametrize("kernel_ms", [0.1, 0.5, 2.0, 20.0])
def test_a_record_halved_or_worse_is_caught_and_the_true_one_passes(kernel_ms):
    overhead = 0.2
    honest = [BatchClock(10, 10 * (kernel_ms + overhead) + 0.03, 10 * kernel_ms) for _ in range(5)]
    halved = [BatchClock(10, 10 * (kernel_ms + overhead) + 0.03, 10 * kernel_ms / 2) for _ in range(5)]
    tenth = [BatchClock(10, 10 * (kernel_ms + overhead) + 0.03, 10 * kernel_ms / 10) for _ in range(5)]
    assert judge_parent_clock(honest, overhead).passed
    assert clock_ratio(honest, overhead) == pytest.approx(1.0, abs=0.05)
    # A halved record leaves half the true time unexplained; the limit is half the reported time plus
    # a margin per call (0.05 ms + the 0.2 ms overhead once more): halving is caught from about 1 ms a
    # call on, and a tenth from about 0.3 ms (shorter calls are within the margin: clock.py says so).
    assert judge_parent_clock(halved, overhead).passed is (kernel_ms < 1.0)
    assert judge_parent_clock(tenth, overhead).passed is (kernel_ms < 0.3)
    # the parent's time over the accounted time: 2 for a halved long kernel, less when the loop's cost
    # is a large part of each call; never below 1 for a record that hides time
    assert clock_ratio(halved, overhead) == pytest.approx((kernel_ms + overhead) / (kernel_ms / 2 + overhead), rel=0.02)
    assert clock_ratio(halved, overhead) > 1.0


def test_the_batch_means_floor_undoes_a_reshaped_record_and_leaves_honest_times_alone():
    # Five batches of ten calls of about 1 ms; one disturbed call of 30 ms in the first batch.
    honest_times = [[1.0 + 0.01 * ((i * 7) % 5) for i in range(10)] for _ in range(5)]
    honest_times[0][3] = 30.0
    flat = [t for batch in honest_times for t in batch]
    batches = [BatchClock(10, sum(b) + 10 * 0.2, sum(b)) for b in honest_times]
    assert counted_times(batches, flat, 0.2, floor=True) == counted_times(batches, flat, 0.2)
    assert statistics.median(counted_times(batches, flat, 0.2, floor=True)) == statistics.median(flat)
    # The same sums, split so that 7 calls of 10 report a hundredth: the median would be 0.01 ms.
    reshaped = [[0.0101] * 7 + [(sum(b) - 7 * 0.0101) / 3] * 3 for b in honest_times]
    forged = [t for batch in reshaped for t in batch]
    assert statistics.median(forged) < 0.02
    assert MEAN_FLOOR_SHARE == 0.9  # a ninth at most to gain (EVALUATION.md says so)
    assert statistics.median(counted_times(batches, forged, 0.2, floor=True)) >= 0.9


def test_one_disturbed_batch_does_not_fail_an_honest_candidate():
    batches = [BatchClock(10, 10 * 1.2, 10 * 1.0) for _ in range(9)] + [BatchClock(10, 400.0, 10.0)]
    assert judge_parent_clock(batches, 0.2).passed


def test_a_disagreeing_batch_counts_at_the_parents_time_so_forging_some_gains_nothing():
    """A CPU shared with other work delays the worker between calls: its batches disagree and count
    at the parent's time, the agreeing ones decide the check. A candidate that halves the record of
    some batches, or slows some on purpose to be rid of them, gets those counted at the parent's
    time: no faster than the truth. One that forges every batch fails."""
    from cutegen.evaluate.clock import counted_times

    honest = BatchClock(10, 10 * 2.2, 10 * 2.0)
    busy = [BatchClock(10, 10 * 2.2 + 300.0, 10 * 2.0) for _ in range(4)]  # delayed, not forged
    assert judge_parent_clock([*busy, honest], 0.2).passed
    forged = BatchClock(10, 10 * 2.2, 10 * 1.0)  # really 2 ms a call, reported 1
    batches = [forged, honest, forged, honest]
    times = [1.0] * 10 + [2.0] * 10 + [1.0] * 10 + [2.0] * 10
    assert judge_parent_clock(batches, 0.2).passed
    assert counted_times(batches, times, 0.2) == pytest.approx([2.0] * 40)
    slowed = BatchClock(10, 10 * 9.2, 10 * 9.0 / 5)  # a slow batch (9 ms a call) made to disagree
    assert min(counted_times([slowed], [1.8] * 10, 0.2)) == pytest.approx(9.0)
    every = judge_parent_clock([forged] * 4, 0.2)
    assert not every.passed and "no timed batch agrees" in every.detail


def test_outputs_computed_when_asked_for_show_in_the_export_time():
    """An export that takes long means its output was computed when asked for: with no export on time
    the check fails; a late one among exports on time (a loaded machine delays some) makes its
    batch's calls count at the time the export took, so computing lazily in some batches gains nothing."""
    from cutegen.evaluate.clock import counted_times, late_exports_ms

    batches = [BatchClock(10, 10 * 5.2, 10 * 5.0) for _ in range(3)]
    on_time = [3.0, 2.5, 2.0]
    assert judge_parent_clock(batches, 0.2, export_ms=on_time, export_calibrated_ms=2.0, median_call_ms=5.0).passed
    one_late = [3.0, 90.0, 2.5]
    assert judge_parent_clock(batches, 0.2, export_ms=one_late, export_calibrated_ms=2.0, median_call_ms=5.0).passed
    late = late_exports_ms(one_late, 2.0, 5.0)
    assert late == [0.0, 88.0, 0.0]
    assert counted_times(batches, [5.0] * 30, 0.2, late) == [5.0] * 10 + [88.0] * 10 + [5.0] * 10
    every = judge_parent_clock(batches, 0.2, export_ms=[90.0, 95.0, 88.0], export_calibrated_ms=2.0, median_call_ms=5.0)
    assert not every.passed and "asked for" in every.detail


# ------------------------------------------------------------------------- through the pipeline


@pytest.fixture(scope="module")
def service():
    with Evaluator("cpu") as shared:
        yield shared


@pytest.fixture()
def config(tmp_path):
    # Timing on, a short run: 3 batches of 10 calls, one output of each verified.
    return EvalConfig(device="cpu", backend="torch", cache_dir=tmp_path / "eval", run_timeout_s=120.0,
                      correctness_trials=2, adversarial_trials=1, weight_seeds=2, timing_trials=30,
                      warmup_trials=2, compile_baseline=False, eager_baseline=False)


def test_an_honest_slow_kernel_is_accepted_with_the_clocks_agreeing(service, config):
    verdict = evaluate_candidate(HONEST / "slow_swish_scale.py", load_task(SWISH), config, service)
    assert verdict.passed, verdict.feedback
    assert verdict.timing.median_ms >= 20.0
    # 20 ms calls against a loop cost of a few ms: the parent's clock and the reported times agree.
    assert 0.5 < verdict.parent_clock_ratio < 1.5
    names = {c.name: c for c in verdict.checks}
    assert names["parent_clock"].passed and names["timed_outputs"].passed
    assert "3 timed outputs checked" in names["timed_outputs"].detail
    # Where the lane's time went: settle's waits, and the reference's share of the timed outputs'
    # comparisons, are parts of their steps (each at most the step's whole).
    steps = dict(verdict.stage_s)
    assert {"settle_closing", "settle_spares", "settle_reference_spare"} <= set(steps)
    assert steps["settle_closing"] + steps["settle_spares"] + steps["settle_reference_spare"] <= steps["settle"] + 0.01
    assert 0 < steps["timed_outputs_trial"] <= steps["timed_outputs"]


@pytest.mark.parametrize("fixture, check", [("52_exit_in_timing", "worker_crashed"),
                                            ("53_honest_only_when_watched", "timed_outputs")])
def test_timing_cheats_are_rejected_by_their_check(fixture, check, service, config):
    verdict = evaluate_candidate(CHEATS / f"{fixture}.py", load_task(SWISH), config, service)
    assert not verdict.passed
    assert verdict.failure == check, verdict.feedback
    if check == "parent_clock":
        assert verdict.parent_clock_ratio > 3.0  # a tenth reported: the parent saw about ten times more


def test_a_record_forged_through_the_heap_is_caught_by_the_clock_when_the_audit_hook_is_off(service, config):
    off = replace(config, guard=False) if "guard" in EvalConfig.__dataclass_fields__ else config
    verdict = evaluate_candidate(CHEATS / "50_halve_timing_record.py", load_task(SWISH), off, service)
    assert not verdict.passed and verdict.failure == "parent_clock", verdict.feedback


def test_a_record_reshaped_with_its_sum_kept_counts_no_call_below_the_batch_means_floor(service, config):
    """Fixture 69 (hook off) rewrites two of every three calls to a hundredth and gives the third the
    rest: the parent's clock agrees with every batch's sum, and the reported median would be 0.2 ms;
    counted, no call is faster than 0.9 of the batches' mean call (20 ms)."""
    off = replace(config, guard=False)
    verdict = evaluate_candidate(CHEATS / "69_reshape_timing_record.py", load_task(SWISH), off, service)
    assert verdict.passed, verdict.feedback
    assert verdict.timing.median_ms >= 0.85 * 20.0 and verdict.timing.min_ms >= 0.85 * 20.0


def test_a_record_with_nan_times_ends_the_job_as_the_protocol_broken(service, config):
    """Fixture 79 (hook off) writes NaN over its first batch's times: the parent reads every batch
    reply into a typed record, and a time that is not a finite number of ms is `worker_protocol`."""
    off = replace(config, guard=False)
    verdict = evaluate_candidate(CHEATS / "79_nan_in_timing_record.py", load_task(SWISH), off, service)
    assert not verdict.passed and verdict.failure == "worker_protocol", verdict.feedback
    assert "finite number of ms" in verdict.feedback


@pytest.mark.parametrize("reply, problem", [
    ({"times_ms": [1.0, 2.0]}, "2 entries for a batch of 3"),
    ({"times_ms": [1.0, float("nan"), 2.0]}, "nan"),
    ({"times_ms": [1.0, -0.5, 2.0]}, "-0.5"),
    ({"times_ms": [1.0, float("inf"), 2.0]}, "inf"),
    ({"times_ms": [1.0, True, 2.0]}, "True"),
    ({"times_ms": [1.0, "2", 2.0]}, "'2'"),
    ({"times_ms": [1.0, 2.0, 3.0], "stream_ms": [1.0]}, "stream_ms holds 1 entries"),
    ({"times_ms": [1.0, 2.0, 3.0], "new_threads": "t"}, "new_threads must be a list"),
    ([1.0, 2.0, 3.0], "must be an object"),
])
def test_a_batch_reply_that_is_not_the_protocols_is_refused_by_name(reply, problem):
    with pytest.raises(ReplyMalformed, match=re.escape(problem)):
        TimedBatchReply.parse(reply, 3)


def test_a_well_formed_batch_reply_reads_into_its_record():
    parsed = TimedBatchReply.parse({"times_ms": [1, 2.5, 0.0], "stream_ms": [], "guard_refusals": ["x"]}, 3)
    assert parsed.times_ms == (1.0, 2.5, 0.0) and parsed.reported_ms == 3.5
    assert parsed.stream_ms == () and parsed.guard_refusals == ("x",)


@pytest.mark.parametrize("parse, reply, problem", [
    (lambda r: CalibrationReply.parse(r, 10), {"calls": 11}, "1 to 10 calls"),
    (lambda r: CalibrationReply.parse(r, 10), {"calls": 0}, "1 to 10 calls"),
    (lambda r: CalibrationReply.parse(r, 10), {"calls": True}, "1 to 10 calls"),
    (lambda r: CalibrationReply.parse(r, 10), {"calls": 5, "idle_limit_ms": float("nan")}, "a time limit must be"),
    (lambda r: WarmupReply.parse(r), {"idle_limit_ms": -1.0}, "a time limit must be"),
    (lambda r: WarmupReply.parse(r), {"idle_limit_ms": 1.0, "guard_refusals": "x"}, "guard_refusals must be a list"),
    (lambda r: WarmupReply.parse(r), [], "must be an object"),
    (lambda r: WarmupReply.parse(r), {"idle_limit_ms": 1.0, "scrub_wait_s": "1"}, "a duration must be"),
    (lambda r: ExportReply.parse(r, [2, 7]), {"outputs": {"2": {}}}, "the parent chose [2, 7]"),
    (lambda r: ExportReply.parse(r, [2]), {"outputs": {"2": {}, "3": {}}}, "names the calls ['2', '3']"),
    (lambda r: ExportReply.parse(r, [2]), {"outputs": {"2": "file"}}, "described by an object"),
])
def test_the_other_timing_replies_that_are_not_the_protocols_are_refused_by_name(parse, reply, problem):
    with pytest.raises(ReplyMalformed, match=re.escape(problem)):
        parse(reply)


@pytest.mark.parametrize("parse, reply, problem", [
    (TrialReply.parse, {"findings": [], "mutated": []}, None),
    (TrialReply.parse, {"findings": "none", "mutated": []}, "findings must be a list"),
    (TrialReply.parse, {"findings": [{"check": "x"}], "mutated": []}, "each with a check and a message"),
    (TrialReply.parse, {"findings": [], "mutated": [True]}, "mutated must be a list of input indices"),
    (TrialReply.parse, {"findings": [], "mutated": [], "fingerprints": [1]}, "fingerprints must be a list of strings"),
    (TrialReply.parse, {"findings": [], "mutated": [], "outputs": "out-1.bin"}, "outputs must describe"),
    (TrialReply.parse, {"findings": [], "mutated": [], "outputs": {}, "new_threads": {}}, "new_threads must be a list"),
    (GhostRunReply.parse, {"base": {}}, "perturbed must describe"),
    (GhostRunReply.parse, "ok", "must be an object"),
    (BuildReply.parse, {"model_new": 1, "kernels": [], "build_s": 0.1}, "model_new must be true or false"),
    (BuildReply.parse, {"model_new": True, "kernels": [{"name": "k"}], "build_s": 0.1}, "whether it was cached"),
    (BuildReply.parse, {"model_new": True, "kernels": [{"name": "k", "cached": False, "compile_s": "1"}],
                        "build_s": 0.1}, "a kernel's compile_s"),
    (BuildReply.parse, {"model_new": True, "kernels": [], "build_s": float("nan")}, "build_s holds nan"),
    (lambda r: WeightsReply.parse(r, 2), {"weights": [{}]}, "weights must hold 2 maps"),
    (lambda r: WeightsReply.parse(r, 1), {"weights": [{"w": 3}]}, "weights must hold 1 maps"),
])
def test_a_trial_ghost_build_or_weights_reply_that_is_not_the_protocols_is_refused_by_name(parse, reply, problem):
    if problem is None:
        assert parse(reply).outputs is None  # a trial whose outputs had the wrong types exports none
        return
    with pytest.raises(ReplyMalformed, match=re.escape(problem)):
        parse(reply)


def test_a_build_and_a_weights_reply_read_into_their_records():
    built = BuildReply.parse({"model_new": True, "kernels": [{"name": "k", "cached": True, "compile_s": None}],
                              "build_s": 1.5, "new_threads": []})
    assert built.model_new and built.kernels[0]["name"] == "k" and built.build_s == 1.5
    assert WeightsReply.parse({"weights": [{"w": "ab12"}]}, 1).weights == ({"w": "ab12"},)


def test_every_batch_exports_and_the_reference_compares_a_drawn_share_of_them():
    """Gigabyte outputs make 50-100 batches of one or two calls: the reference compares each batch's
    exported call with probability TIMED_CHECK_BUDGET / batches, and the last one when no other was;
    every batch exports alike (each export is timed), and every export the reference does not compare
    it lets go, or the worker's exported memory would stay held (48 GiB on the H200)."""
    from cutegen.evaluate import pipeline
    from cutegen.evaluate.verdict import VerdictBuilder

    class Worker:
        run = VerdictBuilder("t", "sha", EvalConfig(device="cpu", backend="torch"))
        exports = 0

        def __call__(self, command, payload=None, step=None):
            if command == "timed_batch":
                return {"times_ms": [1.0] * len(payload["seeds"])}
            if command == "export_timed":
                self.exports += 1
                return {"outputs": {str(i): {"kind": "file"} for i in payload["calls"]}}
            return {}

    def reference(asked):
        return lambda command, *a, **k: asked.append(command) or {"errors": {}}

    for share, sizes, compared in [(0.0, [1] * 50, 1), (1.0, [2] * 5, 5), (0.0, [1], 1)]:
        worker, asked = Worker(), []
        data = pipeline._timed_batches(worker, reference(asked), sizes, 1, share)
        assert worker.exports == len(sizes) and len(data["export_ms"]) == len(sizes)
        assert asked.count("compare_fresh") == len(data["validated"]) == compared
        assert asked.count("let_go") == len(sizes) - compared  # every export is read, compared or not
        if share == 0.0:  # the last batch's call, the only one compared
            assert data["validated"][0]["trial"] >= sum(sizes) - sizes[-1] and asked[-1] == "compare_fresh"
    worker, asked = Worker(), []
    share = min(1.0, pipeline.TIMED_CHECK_BUDGET / 60)
    pipeline._timed_batches(worker, reference(asked), [1] * 60, 1, share)
    assert worker.exports == 60 and len(asked) == 60
    assert 1 <= asked.count("compare_fresh") < 40  # about 12 (fewer than 40 but once in ~1e9 runs)


def test_the_next_batch_waits_for_the_scrub_of_what_a_comparison_gave_back(monkeypatch):
    """The reference process gives a comparison's memory back to the driver, which scrubs it in the
    background at about 500 GB/s of the memory bandwidth (bench/results/scrub-h200/): the next batch
    starts only after that, and the wait is recorded under scrub_wait. No timed call follows the last
    batch's comparison: its scrub is handed back, for a retry's first batch to wait for."""
    from cutegen.evaluate import pipeline, timing
    from cutegen.evaluate.verdict import VerdictBuilder

    events: list[str] = []
    slept: list[float] = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append("sleep") or slept.append(s))

    class Worker:
        run = VerdictBuilder("t", "sha", EvalConfig(device="cpu", backend="torch"))

        def __call__(self, command, payload=None, step=None):
            events.append(command)
            if command == "timed_batch":
                return {"times_ms": [1.0] * len(payload["seeds"])}
            if command == "export_timed":
                return {"outputs": {str(i): {"kind": "file"} for i in payload["calls"]}}
            return {}

    def reference(command, *a, **k):
        events.append(command)
        return {"errors": {}, "freed_bytes": 80_000_000_000}  # 0.2 s at the assumed 400 GB/s

    worker = Worker()
    data = pipeline._timed_batches(worker, reference, [1, 1], 1, 1.0)
    assert events == ["timed_batch", "export_timed", "compare_fresh", "release", "sleep",
                      "timed_batch", "export_timed", "compare_fresh", "release"]
    assert slept == [pytest.approx(0.2, abs=0.05)] and worker.run.stage_s["scrub_wait"] == pytest.approx(slept[0])
    assert data["scrub"][0] == 80_000_000_000
    events.clear()
    pipeline._timed_batches(worker, reference, [1], 1, 1.0, data["scrub"])  # a retry waits for it first
    assert events[:2] == ["sleep", "timed_batch"] and slept[1] == pytest.approx(0.2, abs=0.05)


ERRORS = {"max_abs_error": 0.0, "max_rel_error": 0.0, "rel_l2_error": 0.0, "mismatched_elements": 0,
          "total_elements": 8, "atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("parse, reply, problem", [
    (DeterminismReply.parse, {"errors": ERRORS}, "bitwise must be true or false"),
    (DeterminismReply.parse, {"bitwise": True}, "errors must be an object"),
    (DeterminismReply.parse, {"bitwise": True, "errors": {**ERRORS, "max_abs_error": float("nan")}},
     "errors.max_abs_error holds nan"),
    (DeterminismReply.parse, {"bitwise": True, "errors": {**ERRORS, "mismatched_elements": -1}},
     "errors.mismatched_elements holds -1: a count"),
    (DeterminismReply.parse, {"bitwise": True, "errors": {**ERRORS, "mismatched_elements": 0.5}},
     "errors.mismatched_elements holds 0.5: a count"),
    (DeterminismReply.parse, {"bitwise": True, "errors": {k: v for k, v in ERRORS.items() if k != "atol"}},
     "errors must hold"),
    (DeterminismReply.parse, {"bitwise": True, "errors": {**ERRORS, "passed": True}}, "errors must hold"),
    (AnticheatReply.parse, {"ops": ["aten::empty"]}, "both its ops and the disallowed ones, or neither"),
    (AnticheatReply.parse, {"ops": ["aten::empty"], "disallowed_ops": "none"}, "disallowed_ops must be a list"),
    (AnticheatReply.parse, {"ops": [1], "disallowed_ops": []}, "ops must be a list of names"),
    (KernelAuditReply.parse, {}, "kernels must be an object"),
    (KernelAuditReply.parse, {"kernels": {"own_kernels": ["k"]}}, "library_kernels must be a list"),
    (KernelAuditReply.parse, {"kernels": {"own_kernels": "k", "library_kernels": []}}, "own_kernels must be a list"),
])
def test_a_determinism_or_audit_reply_that_is_not_the_protocols_is_refused_by_name(parse, reply, problem):
    """The determinism run and the audits are computed in the candidate's process: a reply missing a
    field (say, a determinism record without its errors, or an audit that reports its ops but not the
    disallowed ones) is the protocol broken, never a passing check nor a crash of the evaluation."""
    with pytest.raises(ReplyMalformed, match=re.escape(problem)):
        parse(reply)


def test_determinism_and_audit_replies_read_into_what_their_checks_judge():
    from cutegen.evaluate.anticheat import judge_dynamic_checks
    from cutegen.evaluate.correctness import judge_determinism

    same = DeterminismReply.parse({"bitwise": False, "errors": {**ERRORS, "max_abs_error": float("inf"),
                                                                "mismatched_elements": 3}, "new_threads": ["t"]})
    assert same.new_threads == ("t",) and same.errors.mismatched_elements == 3
    assert not judge_determinism({"errors": same.errors, "bitwise": same.bitwise}).passed
    assert AnticheatReply.parse({}).checked() == {}  # the op audit does not apply to the backend
    audit = AnticheatReply.parse({"ops": ["aten::empty", "aten::mm"], "disallowed_ops": ["aten::mm"]})
    kernels = KernelAuditReply.parse({"kernels": {"own_kernels": [], "library_kernels": ["sgemm"], "skipped": None}})
    checks = {c.name: c for c in judge_dynamic_checks({**audit.checked(), **kernels.checked()}, "cute")}
    assert not checks["disallowed_ops"].passed and "aten::mm" in checks["disallowed_ops"].detail
    assert not checks["audit_kernels"].passed and "sgemm" in checks["audit_kernels"].detail


def test_a_kernel_audit_the_profiler_could_not_see_is_not_a_verdict_on_the_candidate():
    """The audit's reply says the profiler was blind (not even the judge's canary seen): the evaluation
    ends as an infrastructure failure named kernel_audit_unavailable, never accepted, never blamed,
    unless the same reply reports the candidate's tampering, which is judged first. A blind reply
    that lists kernels, or a `blind` that is not a boolean, is the protocol broken."""
    from cutegen.evaluate.pipeline import _judge_kernel_audit
    from cutegen.evaluate.verdict import Stop, VerdictBuilder

    config = EvalConfig(device="cuda", backend="cuda")
    blind = {"kernels": {"own_kernels": [], "library_kernels": [], "blind": True, "skipped": "whatever"}}
    run = VerdictBuilder("t", "0" * 64, config)
    with pytest.raises(Stop):
        _judge_kernel_audit(run, KernelAuditReply.parse(blind), config)
    verdict = run.verdict()
    assert not verdict.passed and verdict.infrastructure and verdict.failure == "kernel_audit_unavailable"
    assert "Not a verdict on the candidate" in verdict.feedback and "whatever" not in verdict.feedback
    tampered = VerdictBuilder("t", "0" * 64, config)
    with pytest.raises(Stop):
        _judge_kernel_audit(tampered, KernelAuditReply.parse({**blind, "state_changes": ["torch.zeros replaced"]}),
                            config)
    assert tampered.failure == "global_state_changes" and not tampered.verdict().infrastructure
    seen = VerdictBuilder("t", "0" * 64, config)
    _judge_kernel_audit(seen, KernelAuditReply.parse({"kernels": {"own_kernels": ["k"], "library_kernels": []}}),
                        config)
    assert seen.failure is None and not seen.fields.get("infrastructure")
    # no CUDA in the worker of a CUDA evaluation (skipped, not blind): judged on the empty lists
    unseen = VerdictBuilder("t", "0" * 64, config)
    with pytest.raises(Stop):
        _judge_kernel_audit(unseen, KernelAuditReply.parse(
            {"kernels": {"own_kernels": [], "library_kernels": [], "skipped": "no CUDA device", "blind": False}}),
            config)
    assert unseen.failure == "audit_kernels" and not unseen.verdict().infrastructure
    with pytest.raises(ReplyMalformed, match="kernels.blind holds 1"):
        KernelAuditReply.parse({"kernels": {"own_kernels": [], "library_kernels": [], "blind": 1}})
    with pytest.raises(ReplyMalformed, match="lists kernels it cannot have seen"):
        KernelAuditReply.parse({"kernels": {"own_kernels": ["k"], "library_kernels": [], "blind": True}})


def _correctness_stage_against(monkeypatch, answer, trials: list[dict]):
    """The correctness stage run against a worker whose reply to each command is `answer(command)`
    (the reference answers every comparison with nothing); the record it judged."""
    from types import SimpleNamespace

    from cutegen.evaluate import pipeline
    from cutegen.evaluate.verdict import Stop, VerdictBuilder

    config = EvalConfig(device="cpu", backend="torch")

    class Worker:
        run = VerdictBuilder("t", "sha", config)

        def __call__(self, command, payload=None, step=None):
            return answer(command)

    monkeypatch.setattr(pipeline, "_trial_payload", lambda ref, index: {"trial": index})
    call = Worker()
    ref = SimpleNamespace(data={"weights": [], "trials": trials, "atol": 1e-5, "rtol": 1e-5})
    with pytest.raises(Stop):
        pipeline._correctness_stage(call.run, call, lambda *a, **k: {}, ref, config)
    return call.run


def test_a_determinism_reply_without_its_errors_is_the_protocol_broken_not_a_crash_of_the_evaluation(monkeypatch):
    """A worker that answers the determinism run with `bitwise: true` alone gets `worker_protocol`
    (before, the parent's judge raised a KeyError and the evaluation ended without a verdict)."""
    run = _correctness_stage_against(
        monkeypatch, lambda command: {"bitwise": True} if command == "determinism" else {"weights": []}, [])
    assert run.failure == "worker_protocol" and "errors must be an object" in run.feedback


def test_a_trial_reply_without_its_lists_is_the_protocol_broken_not_a_crash_of_the_evaluation(monkeypatch):
    """A worker that answers a correctness trial with only its outputs (no findings, no mutated inputs:
    the lists the worker-side checks fill) gives the verdict `worker_protocol`."""
    run = _correctness_stage_against(
        monkeypatch, lambda command: {"weights": []} if command == "weights" else {"outputs": {"leaves": []}},
        [{"index": 0, "skipped": False, "adversarial": False, "note": None}])
    assert run.failure == "worker_protocol" and "findings must be a list" in run.feedback


def test_well_formed_timing_replies_read_into_their_records():
    assert CalibrationReply.parse({"calls": 4, "idle_limit_ms": 2}, 10) == CalibrationReply(4, 2.0)
    assert WarmupReply.parse({"idle_limit_ms": None, "new_threads": ["t"]}) == WarmupReply(None, new_threads=("t",))
    assert WarmupReply.parse({"idle_limit_ms": 2.0, "scrub_wait_s": 0.25}).scrub_wait_s == 0.25
    assert ExportReply.parse({"outputs": {"7": {"kind": "file"}}}, [7]).outputs == {7: {"kind": "file"}}


def test_an_export_of_other_calls_than_the_parent_chose_ends_the_job_as_the_protocol_broken():
    """A worker that answers the parent's choice of timed calls with the outputs of calls it picked
    itself (or of fewer calls) fails `worker_protocol`; nothing it exported is compared."""
    from cutegen.evaluate import pipeline
    from cutegen.evaluate.verdict import Stop, VerdictBuilder

    class Worker:
        run = VerdictBuilder("t", "sha", EvalConfig(device="cpu", backend="torch"))

        def __call__(self, command, payload=None, step=None):
            if command == "timed_batch":
                return {"times_ms": [1.0] * len(payload["seeds"])}
            if command == "export_timed":  # always call 0's output, whatever was chosen
                return {"outputs": {"0": {"kind": "file"}}}
            return {}

    compared: list[dict] = []
    call = Worker()
    with pytest.raises(Stop):
        for _ in range(20):  # the choice is drawn: some draw picks another call than 0
            pipeline._timed_batches(call, lambda *a, **k: compared.append(a) or {"errors": {}}, [5], 1)
    assert call.run.failure == "worker_protocol" and "the parent chose" in call.run.feedback


def test_a_memo_by_input_content_never_hits_on_the_timed_calls(service, config):
    """Each timed call has inputs no earlier call saw: the memo costs its lookup and saves nothing,
    so its time is no better than its honest twin's."""
    memo = evaluate_candidate(CHEATS / "54_memo_by_content.py", load_task(SWISH), config, service)
    twin = evaluate_candidate(HONEST / "swish_scale.py", load_task(SWISH), config, service)
    assert twin.passed, twin.feedback
    if memo.passed:
        # The fastest call of each: a medians' comparison on a CPU shared with other tests is noise.
        assert memo.timing.min_ms >= 0.8 * twin.timing.min_ms
    else:  # its growing memo slows the loop around it: the parent's clock may see that too
        assert memo.failure == "parent_clock", memo.feedback


# ------------------------------------------------------------------------------ a shared GPU


def test_processes_outside_the_evaluator_are_told_from_its_own():
    """An out-of-memory message names every process on the GPU; this process and its descendants (the
    evaluator's workers) are its own, any other is a process sharing the GPU."""
    import subprocess
    import sys

    from cutegen.evaluate.contention import describe, foreign_gpu_use

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        message = (f"Process {child.pid} has 3.00 GiB memory in use. Process 4194301 has 2.50 GiB memory in use."
                   f" Including non-PyTorch memory, this process has 1.00 GiB memory in use.")
        foreign = foreign_gpu_use(None, message)
    finally:
        child.kill()
    assert foreign == {4194301: int(2.5 * 2**30)}
    assert describe(foreign) == "1 other process(es) (4194301) holding 2.5 GiB"


def test_a_timing_function_wrapped_at_import_is_never_called(service, config):
    """Fixture 51 wraps the judge's timing function where it finds the module: either the judge's
    own binding is untouched and the kernel is timed at its real cost (20 ms a call), or the wrapped
    record is caught by the parent's clock."""
    verdict = evaluate_candidate(CHEATS / "51_wrap_timing_function.py", load_task(SWISH), config, service)
    if verdict.passed:  # the wrapper never ran: timed at its real cost
        assert verdict.timing.median_ms >= 20.0
    else:  # it ran on the timing module it found: the parent's clock saw the real time
        assert verdict.failure == "parent_clock" and verdict.parent_clock_ratio > 3.0, verdict.feedback
