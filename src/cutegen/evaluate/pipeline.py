"""The evaluation pipeline: static -> build -> correctness -> anticheat -> timing, first failure stops.
(The kernel audit, an anticheat check, runs in the worker after the timed calls and is judged before
them.)

`evaluate_candidate` is the one entry point (the CLI, the agent and the benchmarks call it). Static
checks read the source in this process (AST only, nothing runs); everything else runs in a fresh
worker (worker.py) and comes back as measurements that this module turns into checks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cutegen.config import HALF_DTYPES, EvalConfig
from cutegen.errors import ConfigError, TaskError, ToolchainError
from cutegen.evaluate.verdict import Stop, VerdictBuilder, correct_feedback, crash_line, died_feedback, \
    error_failure, timing_feedback
from cutegen.records import CheckResult, Finding, Task, Verdict


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


def evaluate_candidate(candidate_path: Path, task: Task, config: EvalConfig,
                       pool: Any | None = None) -> Verdict:
    """Judge one candidate for one task; the verdict is decided here, in the parent.

    `pool` (a WorkerPool for config.device) lets successive evaluations reuse warmed workers; without
    one a pool is made for this call and closed after it.
    """
    from cutegen.evaluate.worker import WorkerPool
    from cutegen.tasks import source_sha256

    source = read_candidate(candidate_path)
    run = VerdictBuilder(task.task_id, source_sha256(source), config)
    own_pool = pool is None
    try:
        _static_stage(run, source, config)
        pool = pool if pool is not None else WorkerPool.for_config(config, warm_spares=False)
        _worker_stages(run, source, task, config, pool)
    except Stop:
        pass
    finally:
        if own_pool and pool is not None:
            pool.close()
    return run.verdict()


def _static_stage(run: VerdictBuilder, source: str, config: EvalConfig) -> None:
    from cutegen.evaluate.checks_static import run_static_checks

    findings = tuple(run_static_checks(source, backend=config.backend))
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


class _Calls:
    """Sends commands to the worker; turns errors and deaths into failures at the current stage."""

    def __init__(self, run: VerdictBuilder, worker: Any, config: EvalConfig) -> None:
        self.run, self.worker, self.config = run, worker, config

    def __call__(self, command: str, payload: Any = None) -> Any:
        from cutegen.evaluate.worker import WorkerDied

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
            self.run.gpu_s += time.perf_counter() - started
            self.run.timed(command, started)
        if not reply["ok"]:
            error = reply["error"]
            if error.get("kind") == "toolchain":
                raise ToolchainError(error.get("message", ""), "Fix the CUDA toolchain setup and run again.")
            self.run.fail(*error_failure(error, self.run.stage), detail=error.get("traceback") or None)
        if not reply.get("cuda_ok", True):
            self.run.fail("cuda_error", f"After {command} the CUDA context is broken (a sticky error from"
                          " an earlier asynchronous fault): check bounds and synchronisation in the kernels.")
        return reply["data"]


def _worker_stages(run: VerdictBuilder, source: str, task: Task, config: EvalConfig, pool: Any) -> None:
    from cutegen.evaluate.baselines import get_baselines
    from cutegen.evaluate.sol import get_peaks

    started = time.perf_counter()
    baselines = get_baselines(task, config, pool) if config.do_timing else None
    peaks = get_peaks(config.cache_dir, pool, config.run_timeout_s) if config.do_timing else None
    run.timed("baselines", started)
    started = time.perf_counter()
    with pool.worker() as worker:
        run.timed("worker", started)  # waiting for a started worker (the warmed spare, when there is one)
        call = _Calls(run, worker, config)
        try:
            reference = _reference(run, worker, task, config)
            run.stage = "build"
            _judge_build(run, call("build", {"source": source}))
            run.stage = "correctness"
            _judge_correctness(run, call("correctness"))
            run.stage = "anticheat"
            _judge_anticheat(run, call("anticheat"), config)
            timing = None
            if config.do_timing:
                run.stage = "timing"
                started = time.perf_counter()
                worker.settle()
                run.timed("settle", started)
                timing = call("timing")
            # The kernel audit (backend cute on CUDA) profiles a forward, and CUPTI can stay attached
            # after a profiler session (see anticheat.py), so it runs after timing; it is judged first,
            # as it can void the timing.
            if config.backend == "cute" and config.device == "cuda":
                run.stage = "anticheat"
                _judge_anticheat(run, call("kernel_audit"), config)
            if timing is not None:
                run.stage = "timing"
                _judge_timing(run, timing, task, config, baselines, peaks, reference["dtype"])
            else:
                run.feedback = correct_feedback(run.fields.get("errors"), timed=False)
        finally:
            worker.close()
            run.log_tail = run.log_tail or worker.log_tail()


def _reference(run: VerdictBuilder, worker: Any, task: Task, config: EvalConfig) -> dict[str, Any]:
    """Reference outputs in the worker, before the candidate is imported; a failure is the task's."""
    from cutegen.evaluate.cache import load_probe, save_probe
    from cutegen.evaluate.session import make_job
    from cutegen.evaluate.worker import WorkerDied

    cached = load_probe(config.cache_dir, task, config.track)
    job = make_job(task, config, trials=config.correctness_trials, adversarial=config.adversarial_trials,
                   weight_seeds=config.weight_seeds, probe=cached is None)
    started = time.perf_counter()
    try:
        reply = worker.call("reference", job, timeout_s=config.reference_timeout_s)
    except WorkerDied as died:
        raise TaskError(f"The reference of task {task.task_id} did not complete in the worker: {died.detail}."
                        f"\n{died.log_tail[-1500:]}", "Run the task file on its own and check that its"
                        " reference completes (or raise the reference timeout).") from None
    finally:
        run.gpu_s += time.perf_counter() - started
        run.timed("reference", started)
    if not reply["ok"]:
        error = reply["error"]
        raise TaskError(f"The reference of task {task.task_id} raised {error.get('type')}: "
                        f"{error.get('message', '')[:1500]}", "Run the task file on its own and fix it.")
    data = reply["data"]
    degenerate = cached if cached is not None else tuple(data["degenerate"] or ())
    if cached is None:
        save_probe(config.cache_dir, task, config.track, degenerate)
    run.set(degenerate=degenerate)
    detail = f"trivial solutions pass: {', '.join(degenerate)}" if degenerate else "no trivial solution passes"
    run.add(CheckResult("trivial_solution_probe", "correctness", True, detail))
    exact = data.get("exact_reference")
    run.add(CheckResult("float64_reference", "correctness", True,
                        f"not used: {exact}" if exact else "every trial's reference has its float64 result"))
    return data


def _judge_integrity(run: VerdictBuilder, data: dict[str, Any]) -> None:
    """Global state and threads must be as they were before the candidate's import."""
    if data.get("state_changes"):
        changes = "; ".join(str(c) for c in data["state_changes"][:5])
        run.fail("global_state_changes", f"The candidate changed global torch/timing state: {changes}. Leave"
                 " torch flags, torch functions and timing primitives alone.")
    if data.get("new_threads"):
        threads = ", ".join(str(t) for t in data["new_threads"][:5])
        run.fail("new_threads", f"The candidate left threads running ({threads}); all work must happen"
                 " inside forward, on the current stream.")


def _judge_build(run: VerdictBuilder, data: dict[str, Any]) -> None:
    run.set(build_s=round(data["build_s"], 3))
    if not data["model_new"]:
        run.fail("model_new_missing", "The candidate defines no class ModelNew(nn.Module) at module level.")
    kernels = ", ".join(f"{k['name']} ({'cached' if k['cached'] else '%.1f s' % (k['compile_s'] or 0)})"
                        for k in data["kernels"]) or "no CuTe kernels"
    run.add(CheckResult("build", "build", True, kernels))
    _judge_integrity(run, data)


def _judge_correctness(run: VerdictBuilder, data: dict[str, Any]) -> None:
    from cutegen.evaluate.correctness import aggregate_errors, error_stats, judge_determinism, judge_trials, \
        judge_weights

    weights = judge_weights(data["weights"])
    if not weights.passed:
        run.fail_check(weights, weights.detail)
    run.add(weights)
    checks, failure, feedback = judge_trials(data["trials"])
    stats = [error_stats(t["errors"]) for t in data["trials"] if isinstance(t.get("errors"), dict)]
    run.set(errors=aggregate_errors(stats))
    for check in checks:
        run.add(check)
    if failure:
        run.fail(failure, feedback or failure)
    determinism = judge_determinism(data["determinism"])
    if not determinism.passed:
        run.fail_check(determinism, determinism.detail)
    run.add(determinism)
    _judge_integrity(run, data)


def _judge_anticheat(run: VerdictBuilder, data: dict[str, Any], config: EvalConfig) -> None:
    from cutegen.evaluate.anticheat import judge_dynamic_checks

    for check in judge_dynamic_checks(data, config.backend):
        if not check.passed:
            run.fail_check(check, f"Anti-cheat check {check.name} failed: {check.detail}")
        run.add(check)
    _judge_integrity(run, data)


def _judge_timing(run: VerdictBuilder, data: dict[str, Any], task: Task, config: EvalConfig,
                  baselines: Any, peaks: Any, dtype: str) -> None:
    from cutegen.evaluate.correctness import error_stats
    from cutegen.evaluate.timing import summarize

    _judge_integrity(run, data)
    for entry in data["validated"]:
        stats = error_stats(entry["errors"])
        if stats.mismatched_elements:
            run.fail("timed_outputs", f"The output of timed call {entry['trial']} is wrong"
                     f" ({stats.mismatched_elements} of {stats.total_elements} elements, max abs error"
                     f" {stats.max_abs_error:.3g}) although the correctness calls were right: every call must"
                     " compute its result from its own inputs.")
    timing = summarize(data["times_ms"])
    run.set(timing=timing)
    run.add(CheckResult("timed_outputs", "timing", True, f"{len(data['validated'])} timed outputs checked"))
    _judge_streams(run, data.get("stream_ms", []), data.get("idle_ms", []), data.get("idle_limit_ms"))
    _speed(run, timing, task, config, baselines, peaks, dtype)
    run.feedback = timing_feedback(timing, run.fields, run.fields.get("errors"))
    if run.fields.get("needs_review"):
        run.feedback += f" Speedup above {config.review_speedup:g}x: flagged for review."


def _judge_streams(run: VerdictBuilder, stream_ms: list[float], idle_ms: list[float],
                   limit_ms: float | None) -> None:
    """Defeats work launched on another stream (created where the static checks cannot see it) so
    that the caller's stream, and an end event recorded on it, finish early: the device-wide wait
    after each timed call shows that work outlasted the stream (`timing.hidden_work_trials`). A trial
    or two can exceed the limit through host jitter alone, so the check fails only when most do."""
    from cutegen.evaluate.timing import HIDDEN_SHARE, hidden_work_trials

    trials, hidden = len(idle_ms), hidden_work_trials(stream_ms, idle_ms, limit_ms)
    past = hidden_work_trials(stream_ms, idle_ms, limit_ms, share=0.0)  # the trials timed to the idle device
    if hidden * 2 > trials:
        run.fail("work_past_stream", f"In {hidden} of {trials} timed calls the GPU was still busy"
                 f" more than {limit_ms:.3g} ms, and for over {100 * HIDDEN_SHARE:g}% of the call, after the"
                 " candidate's stream had finished: work runs on another stream. Launch every kernel on the"
                 " stream the launcher is given.")
    run.add(CheckResult("work_past_stream", "timing", True,
                        f"{hidden} of {trials} timed calls hid work past the stream ({past} timed to the idle device)"))


def _speed(run: VerdictBuilder, timing: Any, task: Task, config: EvalConfig, baselines: Any, peaks: Any,
           dtype: str) -> None:
    """Speedups against both baselines and the speed-of-light fraction; below the bound is rejected."""
    from cutegen.evaluate.sol import physical_peaks, sol_bound_ms
    from cutegen.trace import trace_task

    if baselines is not None:
        eager, compiled = baselines.eager, baselines.compiled
        run.set(eager=eager, compiled=compiled, noise_pct=baselines.noise_pct,
                speedup_vs_eager=eager.median_ms / timing.median_ms if eager else None,
                speedup_vs_compile=compiled.median_ms / timing.median_ms if compiled else None)
    if peaks is not None:
        trace, half = trace_task(task), dtype in HALF_DTYPES
        bound = sol_bound_ms(trace, peaks, config.track, half)
        if bound is not None:
            fraction = bound / timing.median_ms
            limit = sol_bound_ms(trace, physical_peaks(peaks), config.track, half) / timing.median_ms
            run.set(sol_bound_ms=bound, sol_fraction=fraction)
            if limit > 1.0 + config.sol_slack:
                run.fail("below_speed_of_light",
                         f"Median {timing.median_ms:.4g} ms is below the speed-of-light bound {bound:.4g} ms"
                         f" ({fraction * 100:.0f}% of it, {limit * 100:.0f}% of the hardware's bound, which takes"
                         " the datasheet's peaks where they are higher): the kernel cannot have done the work the"
                         " task defines (or an algebraic shortcut needs review).")
            run.add(CheckResult("below_speed_of_light", "timing", True,
                                f"{fraction * 100:.1f}% of the bound, {limit * 100:.1f}% of the hardware's"))
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
    builds again and judges it.
    """
    from concurrent.futures import ThreadPoolExecutor

    from cutegen.evaluate.worker import WorkerDied, WorkerPool
    from cutegen.records import to_json

    if not config.runtime.arch:
        raise ConfigError("Prebuilding needs the target architecture.", "Set RuntimeConfig.arch, e.g. sm_90a.")

    def build(pool: WorkerPool, path: Path) -> dict[str, Any]:
        payload = {"source": read_candidate(path), "runtime": to_json(config.runtime)}
        started = time.perf_counter()
        try:
            with pool.worker() as worker:
                reply = worker.call("prebuild", payload, timeout_s=config.build_timeout_s,
                                    timeout_reason="build_timeout")
        except WorkerDied as died:
            reply = {"ok": False, "error": {"kind": died.reason, "message": died.detail}}
        return {"path": str(path), "ok": reply["ok"], "wall_s": time.perf_counter() - started,
                "error": None if reply["ok"] else reply["error"].get("message", "")[:500]}

    with WorkerPool("cpu", cpu_slots=jobs, log_tail_bytes=config.log_tail_bytes) as pool, \
            ThreadPoolExecutor(jobs) as executor:
        return list(executor.map(lambda p: build(pool, p), paths))
