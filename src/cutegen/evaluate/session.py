"""The worker's side of an evaluation: the commands the parent sends, run in order in one process.

For a candidate the parent sends `reference` (task, seeds, settings: reference outputs for every
trial are computed here, before the candidate is imported, and the global state is snapshotted),
then `build` (import the candidate, build its CuTe kernels), `correctness`, `anticheat` and
`timing`. A baseline measurement is `reference` then `baseline`, and `release` ends it: a worker
that has only measured baselines takes the next task's `reference`, a worker that saw a candidate
never does. `peaks` and `prebuild` stand alone.
Every command replies with raw measurements (JSON); the parent decides. Nothing here trusts the
candidate: every result is recomputed from tensors the worker holds.
"""

from __future__ import annotations

import gc
import importlib.util
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from cutegen.records import to_json

CANDIDATE_FILE = "candidate.py"
CANDIDATE_MODULE = "cutegen_candidate"
_MAX_TEXT = 6000


def apply_track(track: str) -> None:
    """TF32 off everywhere on the fp32 track, on for matmul and cuDNN on the tf32 track."""
    import torch

    tf32 = track == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def _task_from_json(data: dict[str, Any]) -> Any:
    from cutegen.journal import from_json
    from cutegen.records import Task

    return from_json(Task, data)


def runtime_from_json(data: dict[str, Any] | None) -> Any:
    from cutegen.config import RuntimeConfig
    from cutegen.journal import from_json

    return from_json(RuntimeConfig, data) if data else RuntimeConfig()


class Hooks:
    """What differs between a CUDA and a CPU run, and the per-call output checks."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def churn(self) -> None:
        if self.cuda:
            from cutegen.evaluate.checks_dynamic import churn_free_memory

            churn_free_memory(self.device)

    def synchronize(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def output_findings(self, out: Any, ref: Any) -> list[dict[str, Any]]:
        """Type problems first (nothing else can be compared then), else non-finite outputs."""
        from cutegen.evaluate.checks_dynamic import check_nonfinite, check_output_types

        for check in (check_output_types, check_nonfinite):
            problems = check(out, ref)
            if problems:
                return [{"check": check.__name__, "message": p, "line": None} for p in problems]
        return []


class Session:
    """The state one worker keeps for one evaluation job."""

    def __init__(self, job: dict[str, Any]) -> None:
        import torch

        from cutegen.runtime import use_config
        from cutegen.tasks import task_module

        self.job = job
        self.device = torch.device("cuda", 0) if job["device"] == "cuda" else torch.device("cpu")
        self.hooks = Hooks(self.device)
        apply_track(job["track"])
        # A baseline's worker may take the next task: what the task's code changes from here on must
        # not reach it (see `_cmd_release`).
        self.state_at_start = self._global_state() if job.get("keep_on_device") else None
        self.runtime = runtime_from_json(job.get("runtime"))
        self._config_scope = use_config(self.runtime)  # lazy builds in forward use it too
        self._config_scope.__enter__()
        self.task = _task_from_json(job["task"])
        self.module = task_module(self.task)
        self.candidate: Any = None
        self.ref_models: list[Any] = []
        self.ref_weights: list[dict[str, Any]] = []
        self.cand_models: dict[int, Any] = {}
        self.trials: list[Any] = []
        self.atol = self.rtol = 0.0
        self.state_before: Any = None
        self.threads_before: Any = None
        self.baseline_sets: list[Any] | None = None  # eager and compiled are timed on the same device copies
        self.compiled: tuple[Any, str | None] | None = None  # (torch.compile'd reference, its error)

    def close(self) -> None:
        self._config_scope.__exit__(None, None, None)

    @staticmethod
    def _global_state() -> dict[str, str]:
        from cutegen.evaluate.checks_dynamic import snapshot_global_state

        return snapshot_global_state()

    def state_changes(self) -> list[str]:
        """What the job's task changed in torch's global state (flags, default dtype, patched
        functions) since the session started, for a baseline job; [] otherwise."""
        from cutegen.evaluate.checks_dynamic import global_state_changes

        if self.state_at_start is None:
            return []
        return global_state_changes(self.state_at_start, self._global_state())

    # -- reference (before the candidate exists in this process)

    def reference(self) -> dict[str, Any]:
        import torch

        from cutegen.evaluate import correctness as c

        job = self.job
        torch.manual_seed(job["init_seed"])
        self.init_inputs = list(self.module.get_init_inputs())
        self.ref_models = [c.build_model(self.module.Model, self.init_inputs, w, self.device)
                           for w in job["weight_seeds"]]
        self.ref_weights = [c.weight_state(m) for m in self.ref_models]
        plans = job["trials"]
        # A baseline's worker never imports a candidate: its inputs need not wait on the host.
        home = self.device if job.get("keep_on_device") else torch.device("cpu")
        first = c.reference_trial(self.module, self.ref_models[plans[0]["weight"]], plans[0], self.device, True,
                                  home)
        clean_finite = c.all_finite(first.reference)
        self.trials = [first] + [c.reference_trial(self.module, self.ref_models[p["weight"]], p, self.device,
                                                   clean_finite, home) for p in plans[1:]]
        dtype = c.lowest_precision(c.tensors_of(first.inputs) + c.tensors_of(first.reference))
        self.atol, self.rtol = job["tolerances"][dtype]
        exact_note = self._exact_deltas() if job.get("exact", True) else None
        degenerate = self._probe() if job.get("probe") else None
        self._snapshot()
        return {"dtype": dtype, "atol": self.atol, "rtol": self.rtol, "degenerate": degenerate,
                "exact_reference": exact_note}

    def _exact_deltas(self) -> str | None:
        """Each trial's float64 result minus its reference (correctness.exact_delta); None when every
        trial has one, else why one does not."""
        from cutegen.evaluate import correctness as c

        models = [c.exact_model(m) for m in self.ref_models]
        notes = []
        for trial in self.trials:
            trial.exact_delta, note = c.exact_delta(models[trial.weight], trial.inputs, trial.reference, self.device)
            if note and trial.reference is not None:
                notes.append(note)
        del models
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()  # the float64 copies' memory goes back before anything is timed
        return notes[0] if notes else None

    def _probe(self) -> list[str]:
        """Trivial answers (zeros, a constant, an input) that pass every clean trial's reference."""
        from cutegen.evaluate.probe import trivial_solution_probe

        clean = [t for t in self.trials if not t.adversarial and t.reference is not None]
        names = list(trivial_solution_probe(clean[0].reference, clean[0].inputs, self.atol, self.rtol))
        for trial in clean[1:]:
            passing = set(trivial_solution_probe(trial.reference, trial.inputs, self.atol, self.rtol))
            names = [n for n in names if n in passing]
        return names

    def _snapshot(self) -> None:
        from cutegen.evaluate.checks_dynamic import snapshot_global_state, thread_snapshot

        self.state_before = snapshot_global_state()
        self.threads_before = thread_snapshot()

    def _integrity(self) -> dict[str, Any]:
        """Global state and thread changes since the snapshot taken before the candidate's import."""
        from cutegen.evaluate.checks_dynamic import global_state_changes, new_threads, snapshot_global_state

        return {"state_changes": to_json(list(global_state_changes(self.state_before, snapshot_global_state()))),
                "new_threads": to_json(list(new_threads(self.threads_before)))}

    # -- the candidate

    def build(self, candidate: dict[str, Any]) -> dict[str, Any]:
        import torch

        if self.job.get("keep_on_device"):  # its references wait on the device, within a candidate's reach
            raise RuntimeError("this worker keeps its references on the device: it measures baselines only")
        started = time.perf_counter()
        self.candidate, kernels = import_and_build(candidate["source"], self.runtime)
        model_new = getattr(self.candidate, "ModelNew", None)
        has_model = isinstance(model_new, type) and issubclass(model_new, torch.nn.Module)
        return {"build_s": time.perf_counter() - started, "kernels": kernels, "model_new": has_model,
                **self._integrity()}

    def correctness(self) -> dict[str, Any]:
        from cutegen.evaluate import correctness as c

        weights = []
        for k, seed in enumerate(self.job["weight_seeds"]):
            self.cand_models[k] = c.build_model(self.candidate.ModelNew, self.init_inputs, seed, self.device)
            weights.append(c.compare_weights(self.ref_weights[k], c.weight_state(self.cand_models[k])))
        trials = c.candidate_trials(self.cand_models.__getitem__, self.trials, self.device,
                                    self.atol, self.rtol, self.hooks)
        first = self.trials[0]
        determinism = c.determinism_run(self.cand_models[first.weight], first, self.device,
                                        self.atol, self.rtol, self.hooks)
        return to_json({"weights": weights, "trials": trials, "determinism": determinism,
                        **self._integrity()})

    def anticheat(self) -> dict[str, Any]:
        from cutegen.evaluate.anticheat import run_dynamic_checks

        first = self.trials[0]
        result = run_dynamic_checks(self.cand_models[first.weight], self.ref_models[first.weight],
                                    first.inputs, self.device, self.job["backend"], self.hooks,
                                    tol=max(self.atol, self.rtol))
        return to_json({**result, **self._integrity()})

    def kernel_audit(self) -> dict[str, Any]:
        from cutegen.evaluate.anticheat import run_kernel_audit

        first = self.trials[0]
        result = run_kernel_audit(self.cand_models[first.weight], first.inputs, self.device)
        return to_json({**result, **self._integrity()})

    def timing_sets(self) -> tuple[list[Any], list[Any]]:
        """Input sets for timing (and their trials, which hold the references): clean trials of the
        first weight seed."""
        from cutegen.evaluate.correctness import to_device

        chosen = [t for t in self.trials if not t.adversarial and t.weight == 0 and t.reference is not None]
        chosen = chosen[: max(1, self.job["timing"]["input_sets"])]
        return [to_device(t.inputs, self.device) for t in chosen], chosen

    def timing(self) -> dict[str, Any]:
        from cutegen.evaluate.compare import compare_outputs
        from cutegen.evaluate.correctness import to_device
        from cutegen.evaluate.timing import random_trials, time_forward

        spec = self.job["timing"]
        sets, chosen = self.timing_sets()
        keep = random_trials(spec["trials"], spec["output_checks"])
        self.hooks.churn()  # the timing inputs' references were on the device during correctness
        run = time_forward(self.cand_models[0], sets, device=self.device, trials=spec["trials"],
                           warmup=spec["warmup"], keep=keep)
        validated = [{"trial": i, "errors": compare_outputs(out, to_device(chosen[which].reference, self.device),
                                                            self.atol, self.rtol, chosen[which].exact_delta)}
                     for i, (which, out) in sorted(run.kept.items())]
        return to_json({"times_ms": run.times_ms, "validated": validated, "stream_ms": run.stream_ms,
                        "idle_ms": run.idle_ms, "idle_limit_ms": run.idle_limit_ms, **self._integrity()})

    def baseline(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`kind`: "compile" (torch.compile and its first call), "eager" (timed twice) or "compiled"
        (timed; compiled first if "compile" was not asked for)."""
        from cutegen.evaluate.baselines import compile_reference, time_baseline

        if self.baseline_sets is None:  # one copy of the trials' inputs for every kind
            self.baseline_sets, _ = self.timing_sets()
        model, kind = self.ref_models[0], payload["kind"]

        def timed(fn: Any) -> list[float]:
            return time_baseline(fn, self.baseline_sets, self.device, self.job["timing"])

        if kind == "eager":
            return {"eager": timed(model), "eager_repeat": timed(model)}
        if self.compiled is None:
            self.compiled = compile_reference(model, self.baseline_sets)
        compiled, error = self.compiled
        if kind == "compile" or compiled is None:
            return {"compiled": None, "compile_error": error}
        return {"compiled": timed(compiled), "compile_error": None}


def import_and_build(source: str, runtime: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Import the candidate from a file in the working directory and build each of its CuTe kernels.

    A KernelBench-style candidate that calls `load_inline` at import builds during the import; the
    parent's build timeout covers both.
    """
    from cutegen.runtime import find_kernels

    path = Path.cwd() / CANDIDATE_FILE
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(CANDIDATE_MODULE, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[CANDIDATE_MODULE] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    kernels = []
    for kernel in find_kernels(module):
        result = kernel.build(runtime)
        kernels.append({"name": kernel.name, "cached": result.cached, "compile_s": result.compile_s,
                        "arch": result.arch})
    return module, kernels


# --------------------------------------------------------------------------------------- dispatch


def _cmd_reference(state: dict, payload: Any) -> Any:
    """A new job's session. Only a worker that has measured nothing but baselines, each released,
    takes a second job, and only a baseline's: a candidate's job always gets a fresh process."""
    baseline = bool(payload.get("keep_on_device"))
    if state.get("jobs") and not (baseline and state.get("baselines_only") and "session" not in state):
        raise RuntimeError("this worker has served a job that was not a released baseline: a new job needs a"
                           " fresh worker")
    state["jobs"] = state.get("jobs", 0) + 1
    state["baselines_only"] = state.get("baselines_only", True) and baseline
    state["session"] = Session(payload)
    return {**state["session"].reference(), "worker_job": state["jobs"]}


def _cmd_release(state: dict, payload: Any) -> Any:
    """End a baseline job so the worker can take the next task's: drop the session (its tensors and
    compiled model), torch.compile's in-process caches (graphs and guards of the task's Model), the
    cuBLAS workspaces (allocated through torch's allocator at a first matmul, they kept every GEMM
    task's worker from being reused on an H200) and the allocator's free blocks. Returns what the
    task changed in torch's global state and the device memory still allocated: a worker with
    either is not fit for the next task."""
    import torch

    session, changes = state.pop("session", None), []
    if session is not None:
        changes = session.state_changes()
        session.close()
        del session
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    gc.collect()
    if not torch.cuda.is_initialized():
        return {"allocated_bytes": 0, "state_changes": changes}
    torch.cuda.synchronize()
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()
    return {"allocated_bytes": torch.cuda.memory_allocated(), "state_changes": changes}


def _cmd_prebuild(state: dict, payload: Any) -> Any:
    started = time.perf_counter()
    _, kernels = import_and_build(payload["source"], runtime_from_json(payload.get("runtime")))
    return {"build_s": time.perf_counter() - started, "kernels": kernels}


def _cmd_peaks(state: dict, payload: Any) -> Any:
    from cutegen.evaluate.sol import measure_peaks

    return measure_peaks()


def _session_command(name: str) -> Callable[[dict, Any], Any]:
    def run(state: dict, payload: Any) -> Any:
        method = getattr(state["session"], name)
        return method(payload) if payload is not None else method()

    return run


COMMANDS: dict[str, Callable[[dict, Any], Any]] = {
    "reference": _cmd_reference,
    "release": _cmd_release,
    "prebuild": _cmd_prebuild,
    "peaks": _cmd_peaks,
    **{name: _session_command(name) for name in ("build", "correctness", "anticheat", "timing", "kernel_audit",
                                                      "baseline")},
}


def run_command(state: dict[str, Any], command: str, payload: Any) -> dict[str, Any]:
    """Run one command; any exception (the candidate's included) becomes a described error."""
    handler = COMMANDS.get(command)
    if handler is None:
        return {"ok": False, "error": {"kind": "protocol", "type": "", "message": f"unknown command {command}"},
                "cuda_ok": True}
    try:
        reply = {"ok": True, "data": handler(state, payload)}
    except BaseException as err:  # noqa: BLE001 - SystemExit and KeyboardInterrupt from a candidate too
        reply = {"ok": False, "error": describe_error(err)}
    reply["cuda_ok"] = cuda_healthy()
    return reply


def cuda_healthy() -> bool:
    """False when the CUDA context is broken (a sticky error): synchronize and run a tiny kernel."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").add_(1).item()) == 2.0
    except BaseException:  # noqa: BLE001
        return False


_CUDA_KINDS = (
    ("out_of_memory", re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
                                 r"can't allocate memory|Tried to allocate", re.I)),
    ("illegal_memory_access", re.compile(r"illegal memory access|cudaErrorIllegalAddress|"
                                         r"CUDA_ERROR_ILLEGAL_ADDRESS", re.I)),
    ("cuda_error", re.compile(r"CUDA error|cudaError|CUDA_ERROR|misaligned address|"
                              r"unspecified launch failure|device-side assert|KernelError", re.I)),
)


def classify_error(err: BaseException, message: str) -> str:
    from cutegen.errors import BuildError, ToolchainError

    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return "out_of_memory"
    if isinstance(err, BuildError) or "Error building extension" in message:
        return "build_error"
    if isinstance(err, ToolchainError):
        return "toolchain"
    for kind, pattern in _CUDA_KINDS:
        if pattern.search(message) or pattern.search(type(err).__name__):
            return kind
    return "exception"


def _safe_str(err: BaseException) -> str:
    try:
        return str(err)[:_MAX_TEXT]
    except BaseException:  # noqa: BLE001 - a candidate's exception may break its own __str__
        return "<unprintable exception>"


def describe_error(err: BaseException) -> dict[str, Any]:
    """What the parent needs to explain an exception: kind, message, the candidate's line, a traceback."""
    message = _safe_str(err)
    try:
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))[-_MAX_TEXT:]
    except BaseException:  # noqa: BLE001
        tb = ""
    line = None
    frame = err.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_filename.endswith(CANDIDATE_FILE):
            line = frame.tb_lineno
        frame = frame.tb_next
    described = {"kind": classify_error(err, message), "type": type(err).__name__, "message": message,
                 "traceback": tb, "candidate_line": line}
    for attr in ("distilled", "log_tail"):
        if isinstance(getattr(err, attr, None), str):
            described[attr] = getattr(err, attr)[-_MAX_TEXT:]
    return described


# ------------------------------------------------------------------------------ the parent's side


def make_job(task: Any, config: Any, *, trials: int, adversarial: int, weight_seeds: int,
             probe: bool, exact: bool = True, keep_on_device: bool = False) -> dict[str, Any]:
    """The `reference` command's payload: everything the worker needs, with fresh seeds. `exact`:
    also run the reference in float64 (only a candidate's comparison uses it, not a baseline).
    `keep_on_device`: keep the trials' inputs and references on the device, not on the host (only
    for a baseline, where no candidate runs: KernelBench's 8 GB inputs took 16 s each to go to the
    host and back)."""
    from dataclasses import replace

    from cutegen.config import HALF_DTYPES
    from cutegen.evaluate.correctness import trial_plan, unpredictable_seed

    dtypes = ("float32", "float64") + HALF_DTYPES
    return {
        "task": to_json(task),
        "device": config.device,
        "track": config.track,
        "backend": config.backend,
        "tolerances": {d: list(config.tolerance(d)) for d in dtypes},
        "init_seed": unpredictable_seed(),
        "weight_seeds": [unpredictable_seed() for _ in range(weight_seeds)],
        "trials": trial_plan(trials, adversarial, weight_seeds),
        "probe": probe,
        "exact": exact,
        "keep_on_device": keep_on_device,
        # The evaluator's build timeout governs (failure "build_timeout"), not nvcc's own.
        "runtime": to_json(replace(config.runtime, nvcc_timeout_s=config.build_timeout_s + 30.0)),
        "timing": {"trials": config.timing_trials, "warmup": config.warmup_trials,
                   "input_sets": config.timing_input_sets, "output_checks": config.timed_output_checks},
    }
