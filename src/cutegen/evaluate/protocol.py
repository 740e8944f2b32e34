"""The commands a worker process runs (worker.serve reads them from the parent's channel).

A worker takes one role with its first job and keeps it:

- a reference process (`reference`, then `compare`, `compare_fresh`, `let_go`, `ghost_plan`, `ghost_judge`,
  `baseline`, `trim`; reference.py): the task's reference side, kept for every candidate of the task. Only a
  reusable job (a suite's baselines, `baselines.BaselineWorker`) may be followed by `release` and
  another task's `reference`;
- a candidate's worker (`setup`, `calibrate` and `calibration_batch` before the candidate's import,
  then `build`, `weights`, `run_trial`, `determinism`, `anticheat`, `ghost_run`, `timing_warmup`,
  `timed_batch`, `export_timed`, `free_cached`, `kernel_audit`, `reexport`, `release`; runner.py): one
  candidate, then the process ends;
- standalone commands: `prebuild` (a build pool's worker: import a candidate, confined, and report its kernels' sources,
  no GPU) and `peaks` (measure the device).

Every command replies with raw measurements (JSON) or a described error; the parent decides.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any, Callable

from cutegen.evaluate.context import runtime_from_json
from cutegen.evaluate.failure import describe_error
from cutegen.evaluate.guard import GuardRefused, findings
from cutegen.evaluate.reference import ReferenceSession
from cutegen.evaluate.runner import CandidateSession, import_and_build
from cutegen.evaluate.sol import measure_peaks

REFERENCE_COMMANDS = ("compare", "compare_fresh", "let_go", "ghost_plan", "ghost_judge", "give_back", "baseline",
                      "trim")
CANDIDATE_COMMANDS = ("calibrate", "calibration_batch", "build", "weights", "run_trial", "determinism",
                      "anticheat", "ghost_run", "timing_warmup", "timed_batch", "export_timed", "free_cached",
                      "kernel_audit", "reexport", "release")


# --------------------------------------------------------------------------------------- dispatch


def _cmd_reference(state: dict, payload: Any) -> Any:
    """A reference job. A worker that served a reusable job and released it may take another."""

    if state.get("role") not in (None, "reference") or "session" in state or \
            (state.get("jobs") and not state.get("reusable")):
        raise RuntimeError("this worker cannot take a new reference job: a reference job needs a fresh worker,"
                           " or one whose reusable job was released")
    state.update(role="reference", jobs=state.get("jobs", 0) + 1, reusable=bool(payload.get("reusable")))
    state["session"] = ReferenceSession(payload)
    return {**state["session"].reference(), "worker_job": state["jobs"]}


def _cmd_setup(state: dict, payload: Any) -> Any:
    """A candidate's job: one per worker, in a process that never held a reference."""

    if state.get("role") is not None:
        raise RuntimeError("this worker has served a job already: a candidate needs a fresh worker")
    state["role"] = "candidate"
    state["session"] = CandidateSession(payload)
    return {"ready": True}


def _cmd_release(state: dict, payload: Any) -> Any:
    """End a reusable reference job so the worker can take the next task's: drop the session (its
    tensors and compiled model), torch.compile's in-process caches (graphs and guards of the task's
    Model), the cuBLAS workspaces (allocated through torch's allocator at a first matmul, they kept
    every GEMM task's worker from being reused on an H200) and the allocator's free blocks. Returns
    what the task changed in torch's global state and the device memory still allocated: a worker
    with either is not fit for the next task."""
    import torch  # lazy: loading torch takes seconds

    if state.get("role") == "candidate":
        state["session"].release()
        return {"released": True}
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
    """Import the candidate, confined (confine.py), and report its kernels' sources: the parent, trusted,
    compiles them into the shared build cache, which this process may not write."""

    started = time.perf_counter()
    _, kernels = import_and_build(payload["source"], runtime_from_json(payload.get("runtime")),
                                  payload.get("guard", True), landlock=payload.get("landlock", True), build=False)
    return {"build_s": time.perf_counter() - started, "kernels": kernels}


def _cmd_peaks(state: dict, payload: Any) -> Any:
    return measure_peaks()


def _session_command(name: str, role: str) -> Callable[[dict, Any], Any]:
    def run(state: dict, payload: Any) -> Any:
        if state.get("role") != role or "session" not in state:
            raise RuntimeError(f"{name} needs a {role} job first")
        if role == "candidate":
            _refuse_after_a_refusal()
        method = getattr(state["session"], name)
        return method(payload) if payload is not None else method()

    return run


def _refuse_after_a_refusal() -> None:
    """Once the guard has refused the candidate an operation, the candidate does not run again: a candidate
    that caught the refusal gains no further call (guard.py); the reply names what was refused."""

    refused = findings()
    if refused:
        raise GuardRefused(f"refused by the judge's guard: {refused[0]} (the candidate is not run again)")


COMMANDS: dict[str, Callable[[dict, Any], Any]] = {
    "reference": _cmd_reference,
    "setup": _cmd_setup,
    "prebuild": _cmd_prebuild,
    "peaks": _cmd_peaks,
    **{name: _session_command(name, "reference") for name in REFERENCE_COMMANDS},
    **{name: _session_command(name, "candidate") for name in CANDIDATE_COMMANDS if name != "release"},
    "release": _cmd_release,
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
    import torch  # lazy: loading torch takes seconds

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").add_(1).item()) == 2.0
    except BaseException:  # noqa: BLE001
        return False


