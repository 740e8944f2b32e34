"""The evaluation pipeline: static -> build -> correctness -> anticheat -> timing, first failure stops.
(The kernel audit, an anticheat check, runs in the worker after the timed calls and is judged before
them.)

`evaluate_candidate` is the one entry point (the CLI, the agent and the benchmarks call it, through an
executor: executor.py runs it on this machine's service, ray_executor.py on a Ray cluster's nodes,
where `evaluate_source` takes the candidate's text). Static checks read the source in this process
(AST only, nothing runs); the build runs in the service's CPU build pool; everything else runs on a
lane of the service (service.py): the candidate in a fresh worker (runner.py), its outputs compared
in the task's reference process (reference.py). Both reply with measurements that this module turns
into checks.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from cutegen.config import HALF_DTYPES, OWN_KERNEL_BACKENDS, EvalConfig
from cutegen.errors import ConfigError, TaskError, ToolchainError
from cutegen.evaluate.anticheat import applies, judge_dynamic_checks
from cutegen.evaluate.checks_static import run_static_checks, static_checks_for
from cutegen.evaluate.clock import (
    RETRY_BATCHES, BatchClock, agreeing_share, clock_ratio, counted_times, judge_parent_clock, late_exports_ms,
    overhead_per_call_ms, prompt_wakeups,
)
from cutegen.evaluate.confine import after_evaluation, before_evaluation, build_reported
from cutegen.evaluate.contention import BUSY_FAILURES, BUSY_WAITS_S, describe, foreign_gpu_use
from cutegen.evaluate.correctness import (
    aggregate_errors, error_stats, judge_determinism, judge_precision_entry, judge_trials, judge_weights,
    unpredictable_seed,
)
from cutegen.evaluate.jobs import candidate_job
from cutegen.evaluate.messages import (
    AfterImport, AnticheatReply, BuildReply, CalibrationReply, DeterminismReply, ExportReply, GhostRunReply,
    KernelAuditReply, ReplyMalformed, TimedBatchReply, TrialReply, WarmupReply, WeightsReply,
)
from cutegen.evaluate.service import Evaluator
from cutegen.evaluate.sol import physical_peaks, work_bound_ms
from cutegen.evaluate.timing import HIDDEN_SHARE, hidden_work_trials, random_trials, summarize, wait_for_scrub
from cutegen.evaluate.transfer import uses_ipc
from cutegen.evaluate.verdict import Stop, VerdictBuilder, correct_feedback, crash_line, died_feedback, \
    error_failure, timing_feedback
from cutegen.evaluate.worker import WorkerDied, WorkerPool
from cutegen.records import CheckResult, Finding, Task, Verdict, to_json
from cutegen.tasks import source_sha256
from cutegen.trace import trace_task


class NeedsDevice(Exception):
    """The candidate passed every stage this machine can run (static checks, the build) and needs the
    evaluation device, which this machine does not have."""


def read_candidate(path: Path) -> str:
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"Candidate file {path} does not exist.", "Pass the path of a Python file that"
                          " defines class ModelNew(nn.Module).") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"Candidate file {path} cannot be read as UTF-8 text: {err}.",
                          "Pass a readable UTF-8 Python source file.") from None


def evaluate_candidate(candidate_path: Path, task: Task, config: EvalConfig, service: Any | None = None,
                       *, device_available: bool = True) -> Verdict:
    """Judge one candidate for one task; the verdict is decided here, in the parent.

    `service` (an `Evaluator` for config.device) keeps its processes between evaluations: the build
    pool, warm workers, the task's reference process; without one an Evaluator is made for this call
    and closed after it. With `device_available` False (split execution) the static checks and the
    build run here and a candidate that passes them raises NeedsDevice instead of a verdict.
    """
    return evaluate_source(read_candidate(candidate_path), task, config, service, device_available=device_available)


def evaluate_source(source: str, task: Task, config: EvalConfig, service: Any | None = None, *,
                    device_available: bool = True) -> Verdict:
    """`evaluate_candidate` on the candidate's source text (an executor on another machine receives
    the source by value: the driver's file is not there)."""

    run = VerdictBuilder(task.task_id, source_sha256(source), config)
    own = service is None
    seal = before_evaluation(config)  # refuses to run where a candidate poisoned the environment (confine.py)
    try:
        _static_stage(run, source, config)
        service = service if service is not None else Evaluator.for_config(config)
        if device_available:
            config = service.with_arch(config)
            service.prepare(task, config)  # the task's reference work, on an idle lane, while this builds
        _build_stage(run, source, config, service)
        if not device_available:
            raise NeedsDevice(f"candidate {run.base['candidate_sha256'][:12]} of {task.task_id} built; it needs"
                              f" a {config.device} device to be evaluated")
        started = time.perf_counter()
        with service.lane(task) as lane:
            run.timed("queue", started)
            held = time.perf_counter()
            try:
                run = _lane_attempts(run, source, task, config, lane)
            finally:
                # a preparation ahead held the lane for this task's reference work: counted here, once
                run.gpu_s = time.perf_counter() - held + run.stage_s.get("prepared", 0.0)
    except Stop:
        pass
    finally:
        if own and service is not None:
            service.close()
    after_evaluation(run, config, seal)  # what kept the candidate's writes in its scratch directory
    return run.verdict()


def _static_stage(run: VerdictBuilder, source: str, config: EvalConfig) -> None:
    findings = tuple(run_static_checks(source, backend=config.backend))
    run.note_run(*(check.__name__ for check in static_checks_for(config.backend)))
    if not findings:
        run.add(CheckResult("static", "static", True, "no findings"))
        return
    by_check: dict[str, list[Finding]] = {}
    for finding in findings:
        by_check.setdefault(finding.check, []).append(finding)
    for name, group in by_check.items():
        run.add(CheckResult(name, "static", False, group[0].message, tuple(group)))
    lines = [f"- {f.check}{f' (line {f.line})' if f.line else ''}: {f.message}" for f in findings[:5]]
    run.fail(findings[0].check, "Static checks rejected the candidate:\n" + "\n".join(lines))


def _build_stage(run: VerdictBuilder, source: str, config: EvalConfig, service: Any) -> None:
    """Build in the service's CPU pool (a candidate of a backend that requires its own kernels, or
    any candidate that declares some): a compile error or a build timeout is judged here, without
    the GPU; any other failure there is left to the candidate's worker, which imports and builds
    again where the device is."""
    if config.backend not in OWN_KERNEL_BACKENDS and "CuteKernel" not in source and "load_inline" not in source:
        return
    run.stage = "build"
    started = time.perf_counter()
    reply = service.build(source, config, label=f"{run.base['task_id']}:{run.base['candidate_sha256'][:12]}")
    run.timed("build_pool", started)
    if reply.get("ok") or not reply.get("conclusive"):
        return
    run.log_tail = reply.get("log_tail", "")
    if reply.get("died"):
        run.fail(reply["died"], died_feedback(reply["died"], reply.get("detail", ""), "build",
                                              config.build_timeout_s), detail=reply.get("detail"))
    error = reply["error"]
    run.fail(*error_failure(error, "build"), detail=error.get("traceback") or None)


class _Calls:
    """Sends commands to the candidate's worker; turns errors and deaths into failures at the
    current stage."""

    def __init__(self, run: VerdictBuilder, worker: Any, config: EvalConfig) -> None:
        self.run, self.worker, self.config = run, worker, config

    def __call__(self, command: str, payload: Any = None, step: str | None = None) -> Any:
        build = command == "build"
        timeout = self.config.build_timeout_s if build else self.config.run_timeout_s
        started = time.perf_counter()
        try:
            reply = self.worker.call(command, payload, timeout_s=timeout,
                                     timeout_reason="build_timeout" if build else "run_timeout")
        except WorkerDied as died:
            self.run.log_tail = died.log_tail
            feedback = died_feedback(died.reason, died.detail, self.run.stage, timeout)
            line = crash_line(died.log_tail)
            if line is not None:
                feedback += f" The candidate was at line {line} when it happened."
            self.run.fail(died.reason, feedback, detail=died.detail)
        finally:
            self.run.timed(step or command, started)
        if not reply["ok"]:
            error = reply["error"]
            if error.get("kind") == "toolchain":
                raise ToolchainError(error.get("message", ""), "Fix the CUDA toolchain setup and run again.")
            if error.get("kind") == "transfer_space":
                self.run.set(infrastructure=True)
            self.run.fail(*error_failure(error, self.run.stage), detail=error.get("traceback") or None)
        if not reply.get("cuda_ok", True):
            self.run.fail("cuda_error", f"After {command} the CUDA context is broken (a sticky error from"
                          " an earlier asynchronous fault): check bounds and synchronisation in the kernels.")
        return reply["data"]


class _ReferenceCalls:
    """Sends commands to the task's reference process. It reads what the candidate's worker
    exported; if that breaks it (a forged descriptor, a CUDA fault while mapping), the candidate
    fails and the lane replaces the reference process. Where CUDA IPC cannot open an output
    (`IpcOpenError`, and only that), the candidate's worker sends the same outputs again as files;
    where IPC has never worked in this evaluator (a system that does not allow it), the service's
    later candidates export files from the start. Any other failure of the reference stays one:
    files are slow for gigabyte outputs, and must not become every later candidate's way for one
    failed comparison (an earlier rule did that, and the 8.6 GB files of KernelBench level1/38 then
    filled the H200's disk)."""

    _DESCRIPTORS = ("outputs", "base", "perturbed")

    def __init__(self, run: VerdictBuilder, lane: Any, ref: Any, config: EvalConfig, call: "_Calls") -> None:
        self.run, self.lane, self.ref, self.config, self.candidate_call = run, lane, ref, config, call

    def __call__(self, command: str, payload: Any = None, step: str | None = None,
                 room: Callable[[], Any] | None = None) -> Any:
        """The command's reply data; `room`, where given, is called once when the reference ran out of
        device memory, and the command is sent again."""
        reply = self._send(command, payload, step)
        if room is not None and not reply["ok"] and reply["error"].get("type") == "OutOfMemoryError" \
                and reply.get("cuda_ok", True):
            room()
            reply = self._send(command, payload, step)
        ipc = any(uses_ipc(payload.get(k)) for k in self._DESCRIPTORS if isinstance(payload, dict))
        if reply["ok"] and ipc:
            self.lane.evaluator.ipc_worked = True
        if not reply["ok"] and reply["error"].get("type") == "IpcOpenError" and reply.get("cuda_ok", True) and ipc:
            if not self.lane.evaluator.ipc_worked:
                self.lane.evaluator.transfer = "file"
            payload = {k: (self.candidate_call("reexport", {"group": v["group"]}, step=step or command)
                           if k in self._DESCRIPTORS and uses_ipc(v) else v) for k, v in payload.items()}
            reply = self._send(command, payload, step)
        if not reply.get("cuda_ok", True):
            self.lane.drop(self.ref)
            self.run.fail("output_transfer", "Reading the candidate's outputs broke the reference process's CUDA"
                          " context: return plain CUDA tensors from forward.")
        if reply["ok"] and isinstance(reply["data"], dict) and "memory_bytes" in reply["data"]:
            self.ref.memory_bytes = int(reply["data"]["memory_bytes"])  # it grows as it serves candidates
        if not reply["ok"]:
            error = reply["error"]
            if error.get("type") == "TransferError":
                self.run.fail("output_transfer", f"The candidate's outputs could not be read: {error.get('message')}")
            self.lane.drop(self.ref)
            # The judge's own process failed (out of memory beside a candidate that holds the rest, say):
            # this evaluation says so and ends; the run goes on, and the task's next evaluation starts a
            # new reference process.
            self.run.set(infrastructure=True)
            self.run.fail("reference_failed", f"Not a verdict on the candidate: the task's reference process failed"
                          f" in {command} ({error.get('type')}: {str(error.get('message'))[:500]}). Evaluate the"
                          " candidate again; if this repeats, the task's reference needs more device memory than"
                          " is free beside the candidate.", detail=str(error.get("traceback", ""))[-2000:] or None)
        return reply["data"]

    def _send(self, command: str, payload: Any, step: str | None) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return self.ref.worker.call(command, payload, timeout_s=self.config.run_timeout_s)
        except WorkerDied as died:
            self.lane.drop(self.ref)
            self.run.fail("reference_process_died", f"The task's reference process ended while it read the"
                          f" candidate's outputs ({died.reason}: {died.detail}).", detail=died.log_tail[-2000:])
        finally:
            self.run.timed(step or command, started)
        raise AssertionError("unreachable")


def _lane_attempts(run: VerdictBuilder, source: str, task: Task, config: EvalConfig, lane: Any) -> VerdictBuilder:
    """`_memory_attempts`, measured again while processes outside this evaluator share the GPU and the
    candidate failed for memory or time (contention.py): after each wait a new attempt, and if the GPU
    is still shared at the end, the infrastructure verdict `gpu_busy` instead of the candidate's failure."""

    checks, fields, ran = list(run.checks), dict(run.fields), dict(run.checks_run)  # the static and build stages'
    run = _memory_attempts(run, source, task, config, lane)
    foreign: dict[int, int] = {}
    for wait_s in BUSY_WAITS_S[:config.busy_retries]:
        if run.failure not in BUSY_FAILURES or config.device != "cuda":
            return run
        foreign = foreign_gpu_use(getattr(lane, "gpu", None), run.feedback)
        if not foreign:
            return run
        time.sleep(wait_s)
        again = VerdictBuilder(task.task_id, run.base["candidate_sha256"], config)
        again.checks, again.fields, again.stage_s = list(checks), dict(fields), dict(run.stage_s)
        again.checks_run = dict(ran)
        again.add(CheckResult("busy_retry", run.stage, True, f"{run.failure} while {describe(foreign)} shared the"
                              f" GPU; evaluated again after {wait_s:g} s"))
        run = _memory_attempts(again, source, task, config, lane)
    if run.failure in BUSY_FAILURES and config.device == "cuda":
        foreign = foreign_gpu_use(getattr(lane, "gpu", None), run.feedback)
        if foreign:
            run.set(infrastructure=True)
            run.add(CheckResult("gpu_busy", run.stage, False, f"{run.failure} in every attempt while {describe(foreign)}"
                                " shared the GPU"))
            run.failure, run.feedback = "gpu_busy", (
                f"Not a verdict on the candidate: it failed with {run.failure} while {describe(foreign)} shared the"
                " GPU, in every attempt. Evaluate it again when the GPU is not shared.")
    return run


def _memory_attempts(run: VerdictBuilder, source: str, task: Task, config: EvalConfig, lane: Any) -> VerdictBuilder:
    """`_lane_stages`, and once more when the candidate ran out of device memory while the evaluator
    itself held memory it could give back (`Lane.release_memory`: other tasks' reference processes,
    this task's grown past its size after the baselines or past its report by the driver's count in
    the out-of-memory message, a worker still ending): an honest candidate
    must not fail for the evaluator's memory. The builder whose verdict counts is returned; a
    retried verdict carries a `memory_retry` check that says what was freed."""
    checks, fields = list(run.checks), dict(run.fields)  # the static and build stages' (kept on a retry)
    ran = dict(run.checks_run)
    try:
        _lane_stages(run, source, task, config, lane)
        return run
    except Stop:
        if run.failure != "out_of_memory" or config.device != "cuda":
            return run
        freed = lane.release_memory(run.feedback)
        if not freed:
            return run
    again = VerdictBuilder(task.task_id, run.base["candidate_sha256"], config)
    again.checks, again.fields, again.stage_s, again.checks_run = checks, fields, dict(run.stage_s), ran
    again.add(CheckResult("memory_retry", "correctness", True, f"the first attempt ran out of device memory while"
                          f" the evaluator held {freed}; that was freed and the candidate evaluated again"))
    try:
        _lane_stages(again, source, task, config, lane)
    except Stop:
        pass
    return again


def _settle(run: VerdictBuilder, worker: Any) -> None:
    """`worker.settle()`, its seconds under "settle" and each of its waits under "settle_" + what it
    waited for (ending workers, spares), which say where a lane's time goes between evaluations."""
    started = time.perf_counter()
    waits = worker.settle() or {}
    run.timed("settle", started)
    for what, seconds in waits.items():
        run.add_s(f"settle_{what}", seconds)


def _lane_stages(run: VerdictBuilder, source: str, task: Task, config: EvalConfig, lane: Any) -> None:
    ref = lane.ready_reference(task, config)
    for step, seconds in ref.seconds.items():
        run.stage_s.setdefault(step, seconds)
    ref.evaluations += 1
    _note_reference(run, ref)
    started = time.perf_counter()
    lane.candidate_room(task, config, ref)
    run.timed("make_room", started)
    started = time.perf_counter()
    with lane.candidate_worker() as worker:
        run.timed("worker", started)  # waiting for a warm worker (the lane's spare, when there is one)
        call = _Calls(run, worker, config)
        refcall = _ReferenceCalls(run, lane, ref, config, call)
        try:
            run.stage = "build"
            call("setup", candidate_job(task, config, ref.job, ref.data, lane.evaluator.transfer))
            run.note_run("worker_protocol", *(["guard_refused"] if config.guard else []))  # every reply, from here on
            calibration = None
            if config.do_timing:  # the parent's clock is calibrated while the worker is still the judge's alone
                _settle(run, worker)
                calibration = _calibrate(run, call, config)
            lane.warm_spare()  # the next candidate's worker may now make its CUDA context (see Lane)
            _judge_build(run, _typed(call, BuildReply.parse, call("build", {"source": source})))
            run.stage = "correctness"
            started = time.perf_counter()
            worker.quiet()  # the lane's spares create their CUDA contexts before the first churn
            run.timed("quiet", started)
            _correctness_stage(run, call, refcall, ref, config)
            run.stage = "anticheat"
            _anticheat_stage(run, call, refcall, ref, config)
            timing = None
            if config.do_timing:
                run.stage = "timing"
                _settle(run, worker)
                timing = _timing_run(run, call, refcall, ref, config, calibration)
                # Either view of the times under the bound gets the strongest verification.
                fastest = min(timing["times_ms"], _counted(timing, calibration)["times_ms"],
                              key=lambda times: statistics.median(times) if times else float("inf"))
                if _under_work_bound(fastest, task, config, ref.peaks, ref.data["dtype"]):
                    # The strongest verification, while nothing else runs on the lane: every call checked.
                    timing["strict"] = _timed_batches(call, refcall, [calibration["calls"]] * STRICT_BATCHES,
                                                      calibration["calls"])
            # Nothing more is timed: the next candidate's worker may start on the GPU (only it: a younger
            # spare's warm-up would still run when the next candidate's clock is calibrated).
            lane.warm_spare(younger=False)
            # The kernel audit (own kernels required, on CUDA) profiles a forward, and CUPTI can stay
            # attached after a profiler session (see anticheat.py), so it runs after timing; it is
            # judged first, as it can void the timing.
            if applies("audit_kernels", config.backend) and config.device == "cuda":
                run.stage = "anticheat"
                _judge_kernel_audit(run, _typed(call, KernelAuditReply.parse,
                                                call("kernel_audit", _trial_payload(ref, 0))), config)
            if timing is not None:
                run.stage = "timing"
                _judge_timing(run, timing, calibration, task, config, ref, ref.data["dtype"])
            else:
                run.feedback = correct_feedback(run.fields.get("errors"), timed=False)
        finally:
            # The pool closes the worker (in the background on a GPU: see WorkerPool.close_later);
            # what it printed so far is the log tail.
            run.log_tail = run.log_tail or worker.log_tail()


def _judge_kernel_audit(run: VerdictBuilder, kernels: KernelAuditReply, config: EvalConfig) -> None:
    """The kernel audit's reply: the integrity it reports, then its kernels; where the profiler saw
    nothing at all (checks_dynamic.audit_kernels: not even the judge's canary), not a verdict on the
    candidate."""
    _judge_integrity(run, kernels)  # first: a candidate that tampered is judged on that
    if kernels.blind:
        run.set(infrastructure=True)
        run.fail("kernel_audit_unavailable", "Not a verdict on the candidate: the profiler recorded no device"
                 " activity, not even a kernel of the judge's own (CUPTI did not start), so the kernels its"
                 " forward launched could not be audited. Evaluate it again; if this repeats, check that the"
                 " CUDA profiler (CUPTI) works on this machine.")
    _judge_anticheat(run, kernels.checked(), config)


def _note_reference(run: VerdictBuilder, ref: Any) -> None:
    run.set(degenerate=ref.degenerate)
    detail = f"trivial solutions pass: {', '.join(ref.degenerate)}" if ref.degenerate else "no trivial solution passes"
    run.add(CheckResult("trivial_solution_probe", "correctness", True, detail))
    if ref.job.get("device") == "cuda" and ref.data.get("home") == "cpu":
        # Said in every verdict of the task: its comparisons then take minutes, not seconds.
        run.add(CheckResult("reference_on_host", "correctness", True, "the reference's outputs did not fit in"
                            " device memory and are kept on the host: each comparison reads them from there"))


def _trial_payload(ref: Any, index: int) -> dict[str, Any]:
    """What the candidate's worker needs to draw trial `index`'s inputs and run it."""
    plan, made = ref.job["trials"][index], ref.data["trials"][index]
    return {"seed": plan["seed"], "weight": plan["weight"], "strength": made["strength"],
            "ref_mutates": made["ref_mutates"]}


def _correctness_stage(run: VerdictBuilder, call: Any, refcall: Any, ref: Any, config: EvalConfig) -> None:
    """Run the candidate by the correctness protocol (EVALUATION.md, "Correctness").

    - Trials: `correctness_trials` (default 5) sets of inputs from fresh seeds drawn with os.urandom
      in the parent, plus `adversarial_trials` (default 1) heavy-tailed sets (`adversarial_like`).
      Trial i uses weight seed i mod `weight_seeds` (default 2): Model and ModelNew are each built
      right after `torch.manual_seed(weight_seed)` with the same init inputs (so weights match by
      construction), and same-named parameters and buffers are then checked to be bitwise equal
      (by fingerprint: the two live in different processes).
    - The reference outputs were computed once for the task, under the track's TF32 settings, in
      the task's reference process, and never leave it. The candidate's worker draws each trial's
      inputs itself from the trial's seed, which it receives only when that trial runs; the first
      clean trial's and the first heavy-tailed trial's inputs must have the reference's fingerprints.
    - Before the candidate's first call the device's free memory is filled with NaN and released
      (`churn_free_memory`), so memory the candidate allocates holds nothing it did not write; the
      determinism, ghost-probe and timing calls churn again.
    - Outputs must be exact torch.Tensor objects of the reference's shape, dtype and device
      (`check_output_types`, against the reference's output spec), with no NaN/Inf where the
      reference has none (`check_nonfinite`, in the reference process).
    - An input the reference leaves unchanged must be unchanged after the candidate's call.
    - Elementwise tolerance `|out - ref| <= atol + rtol * |ref|` (`compare_outputs`, on the device in
      float64 chunks), with max abs, max rel and relative L2 errors and the first mismatching
      elements reported. Where the plain rule fails, the reference's float64 result (`exact_delta`,
      computed once per trial when first needed) is consulted: an element passes when it is no
      farther from that result than the reference itself is, plus the tolerance; such elements are
      counted (`within_reference_error`).
    - Precision (fp32 track, float32 tasks): each output is also judged against the trial's float64
      result, made with the reference before any candidate runs (`correctness.precision_basis`), by
      `compare.judge_precision`: its relative L2 error may be at most 16 times the fp32 reference's
      own plus 2^-19, it must not follow the rounding of the operands to TF32 or bf16, and outputs
      smaller than 1 are judged elementwise with atol scaled to their size (`compare_precision`).
    - The trials run in order and stop at the first that fails (its feedback is the verdict's).
    - Determinism: the first trial again, twice, with churn before each call; the two outputs must
      agree within a tenth of the tolerance (bitwise equality is reported too).
    """

    run.note_run("check_output_types", "inputs_mutated", "check_nonfinite",
                 *(["churn_free_memory"] if config.device == "cuda" else []))
    weights = _typed(call, WeightsReply.parse, call("weights"), len(ref.data["weights"]))
    _judge_integrity(run, weights)
    check = judge_weights([_compare_prints(r, c) for r, c in zip(ref.data["weights"], weights.weights)])
    if not check.passed:
        run.fail_check(check, check.detail)
    run.add(check)
    entries, exact_used, slack_used, exact_notes, churned = [], 0, 0, set(), False
    checked_prints = set()
    for made in ref.data["trials"]:
        index = made["index"]
        if made["skipped"]:
            entries.append({"index": index, "adversarial": made["adversarial"], "skipped": made["note"]})
            continue
        kind = "adversarial" if made["adversarial"] else "clean"
        payload = {**_trial_payload(ref, index), "churn": not churned, "fingerprint": kind not in checked_prints}
        data = _typed(call, TrialReply.parse, call("run_trial", payload))
        churned = True
        _judge_integrity(run, data)
        if data.fingerprints is not None:
            checked_prints.add(kind)
            _check_inputs(run, ref, made, list(data.fingerprints))
        entry = {"index": index, "adversarial": made["adversarial"], "note": made["note"],
                 "findings": list(data.findings), "mutated": list(data.mutated), "errors": None}
        if data.outputs is not None:
            compared = refcall("compare", {"trial": index, "outputs": data.outputs})
            entry["findings"] += compared["findings"]
            entry["errors"], entry["first_mismatches"] = compared["errors"], compared["first_mismatches"]
            entry["precision"], entry["precision_note"] = compared.get("precision"), compared.get("precision_note")
            exact_used += bool(compared.get("exact_used"))
            slack_used += bool(compared.get("slack_used"))
            if compared.get("exact_note"):
                exact_notes.add(compared["exact_note"])
        entries.append(entry)
        if _trial_failed(entry):
            break
    checks, failure, feedback = judge_trials(entries)
    stats = [error_stats(e["errors"]) for e in entries if isinstance(e.get("errors"), dict)]
    run.set(errors=aggregate_errors(stats))
    for check in checks:
        run.add(check)
    if failure:
        run.fail(failure, feedback or failure)
    run.add(CheckResult("float64_reference", "correctness", True,
                        f"not used: {'; '.join(sorted(exact_notes))}" if exact_notes else
                        f"consulted in {exact_used} of {len(stats)} trials (where the plain rule failed)"
                        + (f", its rounding drawn again in {slack_used}" if slack_used else "")))
    first = _trial_payload(ref, 0)
    determinism = _typed(call, DeterminismReply.parse,
                         call("determinism", {**first, "atol": ref.data["atol"], "rtol": ref.data["rtol"]}))
    _judge_integrity(run, determinism)
    result = judge_determinism({"errors": determinism.errors, "bitwise": determinism.bitwise})
    if not result.passed:
        run.fail_check(result, result.detail)
    run.add(result)


def _trial_failed(entry: dict[str, Any]) -> bool:
    errors = entry.get("errors")
    return bool(entry["findings"] or entry["mutated"] or errors is None
                or errors["mismatched_elements"] or errors["max_abs_error"] == float("inf"))


def _compare_prints(reference: dict[str, str], candidate: dict[str, str]) -> dict[str, Any]:
    """The weights check on fingerprints: same-named parameters and buffers must match (they were built
    from one seed)."""
    shared = [name for name in reference if name in candidate]
    return {"compared": len(shared), "differ": [n for n in shared if reference[n] != candidate[n]],
            "reference_count": len(reference)}


def _check_inputs(run: VerdictBuilder, ref: Any, made: dict[str, Any], prints: list[str]) -> None:
    """The candidate's worker must have drawn the reference's inputs: otherwise the comparison would
    judge it on inputs the reference never saw. A mismatch is the task's (its get_inputs() draws
    from something other than the seed), not the candidate's."""

    if prints != made["fingerprints"]:
        raise TaskError(f"Task {run.base['task_id']}: the inputs drawn again from trial {made['index']}'s seed"
                        " differ from the reference's draw.", "Make get_inputs() draw only from torch's (or"
                        " Python's or NumPy's) global generators, which the evaluator seeds.")


def _anticheat_stage(run: VerdictBuilder, call: Any, refcall: Any, ref: Any, config: EvalConfig) -> None:
    """The op audit in the candidate's worker, then the ghost probe split between the two processes
    (checks_dynamic.ghost_probe states it): the reference process draws fresh perturbations of trial
    0's inputs and keeps the masks of the reference's outputs they move; the candidate's worker runs
    each perturbation; the reference process judges."""
    audit = _typed(call, AnticheatReply.parse, call("anticheat", _trial_payload(ref, 0)))
    _judge_integrity(run, audit)
    data = audit.checked()
    tol = max(ref.data["atol"], ref.data["rtol"])
    plan = refcall("ghost_plan", {"tol": tol}, step="ghost")["plan"]
    data["ghost"] = None
    for entry in plan:
        moved = _typed(call, GhostRunReply.parse, call("ghost_run", {**_trial_payload(ref, 0), **entry}, step="ghost"))
        _judge_integrity(run, moved)
        judged = refcall("ghost_judge", {**entry, "tol": tol, "base": moved.base, "perturbed": moved.perturbed},
                         step="ghost")
        if judged["finding"]:
            data["ghost"] = judged["finding"]
            break
    _judge_anticheat(run, data, config)


def _seeds(count: int) -> list[int]:
    return [unpredictable_seed() for _ in range(count)]


def _calibrate(run: VerdictBuilder, call: Any, config: EvalConfig) -> dict[str, Any]:
    """Before the candidate's import: the timing loop's own cost per call on the parent's clock
    (clock.py), and the cost of exporting one retained output."""

    wanted = min(config.timed_batch_calls, config.timing_trials)
    setup = _typed(call, CalibrationReply.parse, call("calibrate", {"calls": wanted, "warmup_seeds": _seeds(2)},
                                                      step="calibrate"), wanted)
    calls, batches = setup.calls, []
    for _ in range(max(1, config.calibration_batches)):
        with prompt_wakeups():
            began = time.perf_counter()
            data = call("calibration_batch", {"seeds": _seeds(calls)}, step="calibrate")
            wall_ms = (time.perf_counter() - began) * 1e3
        batches.append(BatchClock(calls, wall_ms, _typed(call, TimedBatchReply.parse, data, calls).reported_ms))
    began = time.perf_counter()
    call("export_timed", {"calls": [0]}, step="calibrate")
    export_ms = (time.perf_counter() - began) * 1e3
    call("release", step="calibrate")
    return {"calls": calls, "overhead_ms": overhead_per_call_ms(batches), "export_ms": export_ms,
            "batches": batches}


def _typed(call: Any, parse: Callable[..., Any], data: Any, *args: Any) -> Any:
    """A worker's reply as a typed record (messages.py); one that does not fit fails `worker_protocol`."""
    try:
        return parse(data, *args)
    except ReplyMalformed as err:
        call.run.fail("worker_protocol", f"A worker's reply was not the protocol's: {err}. The judge's records are"
                      " its own; a candidate must not write them.", detail=str(err))
        raise  # fail() stops the evaluation; this line is never reached


def _batch_sizes(trials: int, calls: int) -> list[int]:
    """`trials` timed calls in batches of at most `calls`."""
    return [calls] * (trials // calls) + ([trials % calls] if trials % calls else [])


def _timed_batches(call: Any, refcall: Any, sizes: list[int], checks: int, share: float = 1.0,
                   scrub: tuple[int, float] = (0, 0.0)) -> dict[str, Any]:
    """Timed batches of the given sizes (runner.timed_batch); after each has returned, the parent draws
    which `checks` of its calls to export (all of them when `checks` >= the batch) and whether the
    reference process compares them with its own outputs on the same inputs: with probability `share`,
    and always for the last batch when no earlier one was compared. Every batch exports alike, and its
    export is timed, so work put off until the export costs every batch (clock.late_exports_ms), not
    only the compared ones; an export not compared is let go (transfer.let_go) so that its memory is
    freed. A batch starts only once the driver's scrub of the memory the previous batch's comparisons
    gave back is over (timing.wait_for_scrub); `scrub` and data["scrub"]: (bytes, time.perf_counter()
    when they went back) not yet waited for, before the first batch and after the last."""

    data: dict[str, Any] = {"times_ms": [], "stream_ms": [], "idle_ms": [], "clocks": [], "export_ms": [],
                            "validated": []}
    draw = random.Random(os.urandom(16))  # no seed the candidate could predict
    done = 0
    for number, calls in enumerate(sizes):
        # The driver's scrub of what the comparisons gave back would slow this batch's calls.
        call.run.add_s("scrub_wait", wait_for_scrub(scrub[0], time.perf_counter() - scrub[1]))
        seeds = _seeds(calls)
        with prompt_wakeups():
            began = time.perf_counter()
            raw = call("timed_batch", {"seeds": seeds}, step="timing")
            wall_ms = (time.perf_counter() - began) * 1e3
        reply = _typed(call, TimedBatchReply.parse, raw, calls)
        data["clocks"].append(BatchClock(calls, wall_ms, reply.reported_ms))
        for key in ("times_ms", "stream_ms", "idle_ms"):
            data[key] += list(getattr(reply, key))
        for key in ("state_changes", "new_threads", "guard_refusals"):
            data[key] = list(getattr(reply, key)) or data.get(key)
        chosen = list(random_trials(calls, checks))  # drawn now, after the calls ran
        began = time.perf_counter()
        exported = _typed(call, ExportReply.parse, call("export_timed", {"calls": chosen}, step="timed_outputs"),
                          chosen).outputs
        data["export_ms"].append((time.perf_counter() - began) * 1e3)
        compared_now = draw.random() < share or (number == len(sizes) - 1 and not data["validated"])
        freed = 0  # bytes the reference process gave back to the driver after its comparisons
        for i in chosen:
            if not compared_now:  # read and dropped all the same, or the worker's export stays held
                refcall("let_go", {"outputs": exported[i]}, step="timed_outputs")
                continue
            # A fresh trial of a gigabyte task may not fit beside the worker's cached blocks: those go back
            # first. The worker then learns that this batch, already timed, is compared, before the
            # reference reads its output (EVALUATION.md, "What is not defended"); the next batch's first
            # call finds no cached block (its allocation is timed, never a gain).
            compared = refcall("compare_fresh", {"seed": seeds[i], "outputs": exported[i]}, step="timed_outputs",
                               room=lambda: call("free_cached", step="timed_outputs"))
            call.run.add_s("timed_outputs_trial", compared.get("trial_s", 0.0))  # (the reference's: its trial)
            freed += int(compared.get("freed_bytes", 0))
            data["validated"].append({"trial": done + i, "errors": compared["errors"],
                                      "precision": compared.get("precision")})
        call("release", step="timed_outputs")
        scrub = (freed, time.perf_counter())
        done += calls
    data["scrub"] = scrub
    return data


def _timing_run(run: VerdictBuilder, call: Any, refcall: Any, ref: Any, config: EvalConfig,
                calibration: dict[str, Any]) -> dict[str, Any]:
    """The timing protocol (timing.time_batch states it): warm-up calls, then timed batches on inputs
    no other call saw, each timed on the parent's clock too, with outputs verified after each batch."""
    gave = refcall("give_back", step="timing")  # the reference's cached blocks: the timed calls' room
    warm = _typed(call, WarmupReply.parse, call("timing_warmup", {"seeds": _seeds(config.warmup_trials),
                                                                  "freed_bytes": int(gave.get("freed_bytes", 0))},
                                                step="timing"))
    run.add_s("scrub_wait", warm.scrub_wait_s)
    calls = calibration["calls"]
    sizes = _batch_sizes(config.timing_trials, calls)
    share = min(1.0, TIMED_CHECK_BUDGET / len(sizes))
    data = _timed_batches(call, refcall, sizes, config.timed_output_checks, share)
    pending = data.pop("scrub")  # no timed call follows the last batch's comparisons, unless retried
    # Too few batches agree, or no export came on time: the machine, or the candidate; measured again.
    if agreeing_share(data["clocks"], calibration["overhead_ms"]) < 0.5 or not _clock_check(data, calibration).passed:
        more = _timed_batches(call, refcall, [calls] * RETRY_BATCHES, config.timed_output_checks, share, pending)
        more.pop("scrub")
        for key in ("times_ms", "stream_ms", "idle_ms", "clocks", "export_ms", "validated"):
            data[key] += more[key]
        data["clock_retried"] = True
    data["idle_limit_ms"] = warm.idle_limit_ms
    data["state_changes"] = data.get("state_changes") or list(warm.state_changes)
    data["new_threads"] = data.get("new_threads") or list(warm.new_threads)
    data["guard_refusals"] = data.get("guard_refusals") or list(warm.guard_refusals)
    return data


def _judge_integrity(run: VerdictBuilder, data: dict[str, Any] | AfterImport) -> None:
    """Global state and threads must be as they were before the candidate's import (`data`: a reply,
    as a dict or a typed record of messages.py)."""
    if isinstance(data, AfterImport):
        data = {"guard_refusals": data.guard_refusals, "state_changes": data.state_changes,
                "new_threads": data.new_threads}
    run.note_run("global_state_changes", "new_threads")
    if data.get("guard_refusals"):
        refused = "; ".join(str(r) for r in data["guard_refusals"][:5])
        run.fail("guard_refused", f"The judge's guard refused the candidate: {refused}. Candidate code may not read"
                 " frames or the heap, trace, use ctypes, start processes, replace code or write outside its"
                 " working directory.")
    if data.get("state_changes"):
        changes = "; ".join(str(c) for c in data["state_changes"][:5])
        run.fail("global_state_changes", f"The candidate changed global torch/timing state: {changes}. Leave"
                 " torch flags, torch functions and timing primitives alone.")
    if data.get("new_threads"):
        threads = ", ".join(str(t) for t in data["new_threads"][:5])
        run.fail("new_threads", f"The candidate left threads running ({threads}); all work must happen"
                 " inside forward, on the current stream.")


def _judge_build(run: VerdictBuilder, data: BuildReply) -> None:
    run.set(build_s=round(data.build_s, 3))
    if not data.model_new:
        run.fail("model_new_missing", "The candidate defines no class ModelNew(nn.Module) at module level.")
    kernels = ", ".join(f"{k['name']} ({'cached' if k['cached'] else '%.1f s' % (k.get('compile_s') or 0)})"
                        for k in data.kernels) or "no cutegen runtime kernels"
    run.add(CheckResult("build", "build", True, kernels))
    _judge_integrity(run, data)


def _judge_anticheat(run: VerdictBuilder, data: dict[str, Any], config: EvalConfig) -> None:
    """The dynamic checks' results (`data`: the audits' typed replies, `checked()`, and the ghost probe's
    finding), after the replies' integrity lists were judged."""
    for check in judge_dynamic_checks(data, config.backend):
        if not check.passed:
            run.fail_check(check, f"Anti-cheat check {check.name} failed: {check.detail}")
        run.add(check)


def _judge_validated(run: VerdictBuilder, validated: list[dict[str, Any]], what: str) -> None:
    for entry in validated:
        stats = error_stats(entry["errors"])
        if stats.mismatched_elements:
            run.fail("timed_outputs", f"The output of {what} {entry['trial']} is wrong"
                     f" ({stats.mismatched_elements} of {stats.total_elements} elements, max abs error"
                     f" {stats.max_abs_error:.3g}) although the correctness calls were right: every call must"
                     " compute its result from its own inputs.")
        # The precision rule holds for timed calls too: fp32 in the trials and TF32 when timed is caught here.
        precision = judge_precision_entry(entry.get("precision"), f"{what} {entry['trial']}")
        if not precision.passed:
            run.fail(precision.name, precision.detail)


def _counted(data: dict[str, Any], calibration: dict[str, Any]) -> dict[str, Any]:
    """The per-call times the verdict counts (clock.counted_times): a batch the parent's clock
    disagrees with at the parent's time, a batch whose export came late at the time the export
    took, no call faster than the floor its batch means set; and the median call on the clock
    alone, which sets the exports' allowance."""
    overhead = calibration["overhead_ms"]
    clocked = counted_times(data["clocks"], data["times_ms"], overhead)
    median = statistics.median(clocked) if clocked else 0.0
    late = late_exports_ms(data["export_ms"], calibration["export_ms"], median)
    counted: dict[str, Any] = {key: counted_times(data["clocks"], data[key], overhead)
                               for key in ("stream_ms", "idle_ms") if data.get(key)}
    counted["times_ms"] = counted_times(data["clocks"], data["times_ms"], overhead, late, floor=True)
    counted["clocked_times_ms"], counted["median_call_ms"] = clocked, median
    return counted


def _clock_check(data: dict[str, Any], calibration: dict[str, Any]) -> CheckResult:
    return judge_parent_clock(data["clocks"], calibration["overhead_ms"], data["export_ms"],
                              calibration["export_ms"], _counted(data, calibration)["median_call_ms"])


def _judge_clock(run: VerdictBuilder, data: dict[str, Any], calibration: dict[str, Any]) -> CheckResult:
    check = _clock_check(data, calibration)
    if not check.passed:
        run.fail_check(check, f"Timing rejected: {check.detail}. Every call's work must happen inside the"
                       " call, and the reported times must be the real ones.")
    return check


def _judge_timing(run: VerdictBuilder, data: dict[str, Any], calibration: dict[str, Any], task: Task,
                  config: EvalConfig, ref: Any, dtype: str) -> None:
    _judge_integrity(run, data)
    _judge_validated(run, data["validated"], "timed call")
    run.set(parent_clock_ratio=clock_ratio(data["clocks"], calibration["overhead_ms"]))
    clock = _judge_clock(run, data, calibration)
    counted = _counted(data, calibration)
    timing = summarize(counted["times_ms"])
    if counted.get("stream_ms") and counted.get("idle_ms"):
        timing = replace(timing, stream_median_ms=statistics.median(counted["stream_ms"]),
                         idle_median_ms=statistics.median(counted["idle_ms"]),
                         past_stream_trials=sum(1 for t, s in zip(counted["clocked_times_ms"], counted["stream_ms"])
                                                if t != s))
    run.set(timing=timing)
    run.add(CheckResult("timed_outputs", "timing", True, f"{len(data['validated'])} timed outputs checked,"
                        " each on inputs of its own, chosen after its batch ran"))
    run.add(clock)
    _judge_streams(run, data.get("stream_ms", []), data.get("idle_ms", []), data.get("idle_limit_ms"))
    _speed(run, timing, task, config, ref.baselines, ref.peaks, dtype)
    _judge_work_bound(run, timing, data.get("strict"), calibration, task, config, ref, dtype)
    run.feedback = timing_feedback(timing, run.fields, run.fields.get("errors"))
    if run.fields.get("beat_work_bound"):
        run.feedback += (" It beat the reference algorithm's work bound; every call of a further timed run was"
                         " verified and the parent's clock agreed.")
    if run.fields.get("needs_review"):
        run.feedback += f" Speedup above {config.review_speedup:g}x: flagged for review."


def _judge_streams(run: VerdictBuilder, stream_ms: list[float], idle_ms: list[float],
                   limit_ms: float | None) -> None:
    """Defeats work launched on another stream (created where the static checks cannot see it) so
    that the caller's stream, and an end event recorded on it, finish early: the device-wide wait
    after each timed call shows that work outlasted the stream (`timing.hidden_work_trials`). A trial
    or two can exceed the limit through host jitter alone, so the check fails only when most do."""

    trials, hidden = len(idle_ms), hidden_work_trials(stream_ms, idle_ms, limit_ms)
    past = hidden_work_trials(stream_ms, idle_ms, limit_ms, share=0.0)  # the trials timed to the idle device
    if hidden * 2 > trials:
        run.fail("work_past_stream", f"In {hidden} of {trials} timed calls the GPU was still busy"
                 f" more than {limit_ms:.3g} ms, and for over {100 * HIDDEN_SHARE:g}% of the call, after the"
                 " candidate's stream had finished: work runs on another stream. Launch every kernel on the"
                 " stream the launcher is given.")
    run.add(CheckResult("work_past_stream", "timing", True,
                        f"{hidden} of {trials} timed calls hid work past the stream ({past} timed to the idle device)"))


STRICT_BATCHES = 2  # batches of the strongest verification (every call checked) under the work bound
# The batches whose exported outputs the reference compares, in expectation, per timed run. A task with
# gigabyte outputs fits one or two retained calls in a batch, so 100 timed calls make 50 to 100 batches,
# and comparing one call of each (a fresh trial, three float64 forwards, the rules) took 18.8 s of a
# 24 s evaluation of KernelBench level1/36 on the H200 (bench/results, part N). Each batch is compared
# with probability TIMED_CHECK_BUDGET / batches, drawn after it ran, and exports the same either way, so
# work put off until the export costs every batch. The candidate may learn that a batch was compared (a
# worker asked to free its cache for the comparison), which does not change that batch's timing, and the
# next batch's draw is independent. One wrong in every timed call is always caught (the last batch is
# compared when no other was); one wrong in a fraction f of its calls escapes with probability about
# (1 - f) ** 12, and gains at most that fraction of the time.
TIMED_CHECK_BUDGET = 12


def _work_bound_ms(task: Task, config: EvalConfig, peaks: Any, dtype: str) -> float | None:
    """The reference algorithm's work bound at the hardware's peaks (sol.physical_peaks: the larger of
    datasheet and measured), or None when the peaks are unknown."""

    if peaks is None:
        return None
    return work_bound_ms(trace_task(task), peaks, config.track, dtype in HALF_DTYPES)


def _under_work_bound(times_ms: list[float], task: Task, config: EvalConfig, peaks: Any, dtype: str) -> bool:
    bound = _work_bound_ms(task, config, peaks, dtype)
    return bool(times_ms) and bound is not None and statistics.median(times_ms) * (1.0 + config.sol_slack) < bound


def _output_floor_ms(ref: Any, peaks: Any) -> float | None:
    """Writing the outputs once at the hardware's peak bandwidth: no kernel that produces them is faster."""

    import torch  # lazy: loading torch takes seconds

    if peaks is None:
        return None
    out_bytes = sum(torch.empty((), dtype=getattr(torch, leaf["dtype"])).element_size() * math.prod(leaf["shape"])
                    for leaf in ref.data.get("leaves", []))
    return out_bytes / (physical_peaks(peaks).bandwidth_gb_s * 1e6)


def _judge_work_bound(run: VerdictBuilder, timing: Any, strict: dict[str, Any] | None, calibration: dict[str, Any],
                      task: Task, config: EvalConfig, ref: Any, dtype: str) -> None:
    """A time under the reference algorithm's work bound is evidence, not a verdict: a task's stated
    structure can need less work than its reference does (level1/14's triangular products). Such a
    kernel gets the strongest verification (a further timed run, every call on inputs of its own and
    verified, the parent's clock agreeing); it is rejected when that fails, or when its time is under
    what writing its outputs once at peak bandwidth takes (`below_output_floor`)."""
    if strict is None:
        return
    floor = _output_floor_ms(ref, ref.peaks)
    if floor is not None and timing.median_ms * (1.0 + config.sol_slack) < floor:
        run.fail("below_output_floor", f"Median {timing.median_ms:.4g} ms is under the {floor:.4g} ms that writing"
                 " the outputs once at the GPU's peak bandwidth takes: no kernel that writes its outputs is that fast.")
    _judge_validated(run, strict["validated"], "verified call")
    check = _judge_clock(run, strict, calibration)
    share = agreeing_share(strict["clocks"], calibration["overhead_ms"])
    if check.passed and share < 1.0:  # here every batch must agree, not only one
        run.fail("parent_clock", f"Under the reference's work bound, every batch of the verified run must agree with"
                 f" the parent's clock; {share:.0%} did ({check.detail}).")
    bound = run.fields.get("sol_bound_ms")
    run.set(beat_work_bound=True)
    run.add(CheckResult("beat_work_bound", "timing", True,
                        f"median {timing.median_ms:.4g} ms under the reference's work bound {bound:.4g} ms;"
                        f" {len(strict['validated'])} further timed calls all verified; {check.detail}"))


def _speed(run: VerdictBuilder, timing: Any, task: Task, config: EvalConfig, baselines: Any, peaks: Any,
           dtype: str) -> None:
    """Speedups against both baselines, and the fraction of the reference algorithm's work bound at the
    hardware's peaks (never above 1 for an honest kernel that does the reference's work)."""
    if baselines is not None:
        eager, compiled = baselines.eager, baselines.compiled
        run.set(eager=eager, compiled=compiled, noise_pct=baselines.noise_pct,
                speedup_vs_eager=eager.median_ms / timing.median_ms if eager else None,
                speedup_vs_compile=compiled.median_ms / timing.median_ms if compiled else None)
    bound = _work_bound_ms(task, config, peaks, dtype)
    if bound is not None:
        fraction = bound / timing.median_ms
        run.set(sol_bound_ms=bound, sol_fraction=fraction)
        run.add(CheckResult("work_bound", "timing", True, f"{fraction * 100:.1f}% of the reference algorithm's"
                            f" work bound ({bound:.4g} ms at the hardware's peaks)"))
    speedup = run.fields.get("speedup_vs_eager")
    if speedup is not None and speedup > config.review_speedup:
        run.set(needs_review=True)
        run.add(CheckResult("speedup_review", "timing", True,
                            f"{speedup:.1f}x over eager exceeds {config.review_speedup:g}x: flagged for review"))


def prebuild_candidates(paths: list[Path], config: EvalConfig, jobs: int = 4) -> list[dict[str, Any]]:
    """Build the CuTe kernels of many candidates at once, each in its own CPU worker (no GPU), so that
    their evaluations, which run one at a time per GPU, find every build in the cache.

    `config.runtime.arch` must be set (a CPU worker cannot read it off a device) to the value the
    evaluations use, or their cache keys differ. A failure here is only reported: the evaluation
    builds again and judges it. One row per path: ok, wall_s, error, and each kernel's name, arch,
    whether the cache had it and nvcc's seconds; `skipped` says why a candidate was not looked at (a
    load_inline extension is built by torch where it is evaluated). The public entry of `cutegen prebuild`.
    """

    if not config.runtime.arch:
        raise ConfigError("Prebuilding needs the target architecture.", "Set RuntimeConfig.arch, e.g. sm_90a.")

    def build(pool: WorkerPool, path: Path) -> dict[str, Any]:
        source = read_candidate(path)
        if "load_inline" in source and "CuteKernel" not in source:
            # torch builds such an extension when the candidate is imported, against the torch and CUDA
            # of the machine that runs it: nothing built here would serve another machine.
            return {"path": str(path), "ok": True, "wall_s": 0.0, "kernels": [], "error": None,
                    "skipped": "a load_inline extension, built by torch on the machine that evaluates it"}
        payload = {"source": source, "runtime": to_json(config.runtime), "guard": config.guard,
                   "landlock": config.confinement != "hashes"}
        started = time.perf_counter()
        try:
            with pool.worker() as worker:
                reply = worker.call("prebuild", payload, timeout_s=config.build_timeout_s,
                                    timeout_reason="build_timeout")
            # the worker imported the candidate, confined, and reported its kernels; built here, trusted
            reply = build_reported(reply, config.runtime, config.build_timeout_s)
        except WorkerDied as died:
            reply = {"ok": False, "error": {"kind": died.reason, "message": died.detail}}
        return {"path": str(path), "ok": reply["ok"], "wall_s": time.perf_counter() - started,
                "kernels": reply["data"]["kernels"] if reply["ok"] else [],
                "error": None if reply["ok"] else reply["error"].get("message", "")[:500]}

    with WorkerPool("cpu", cpu_slots=jobs, log_tail_bytes=config.log_tail_bytes) as pool, \
            ThreadPoolExecutor(jobs) as executor:
        return list(executor.map(lambda p: build(pool, p), paths))
