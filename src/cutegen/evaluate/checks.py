"""The registry of the evaluator's checks: one entry per name a verdict can carry (EVALUATION.md,
"Classes, checks and fixtures").

Each entry says what kind of check it is, where it observes the candidate, how it judges, the exploit
it defeats (for a defence) and the backends it applies to. The name is exactly the one a verdict
shows: `CheckResult.name`, `Verdict.failure` (`VerdictBuilder.fail(name, ...)`), a static
`Finding.check`. The static and dynamic check tables (`checks_static.STATIC_CHECK_BACKENDS`,
`anticheat.DYNAMIC_CHECK_BACKENDS`) are read from here, so where a check applies is said once.

Kinds:
- defence: defeats an exploit a reward-hacking candidate would try; tests/fixtures/cheats/ holds at
  least one candidate whose `# caught-by:` names it (tests/test_check_registry.py holds the registry
  to that, and to every name the evaluator's source emits being registered);
- fault: the candidate's own failure that is not a cheat (it does not build, crashes, hangs, is wrong);
- infrastructure: not a verdict on the candidate (the GPU was shared, the environment is poisoned);
- evidence: a record that never rejects (what was measured, a note, a summary of passed checks).

The fixtures of each check are not listed here: they are the files whose header names it, read by
tests/fixture_headers.py (`fixtures_by_check`), so that a fixture says once what catches it. A cheat
fixture with `caught-by: none` (NO_CHECK) is one the protocol itself takes the gain from: it must be
timed no faster than its honest twin.
"""

from __future__ import annotations

from dataclasses import dataclass

from cutegen.config import BACKENDS, OWN_KERNEL_BACKENDS

DEFENCE, FAULT, INFRASTRUCTURE, EVIDENCE = "defence", "fault", "infrastructure", "evidence"
KINDS = (DEFENCE, FAULT, INFRASTRUCTURE, EVIDENCE)

# Where a check observes the candidate, from the farthest from its reach to the nearest.
STATIC = "static"
BUILD = "build"
REFERENCE = "reference"
PARENT_CLOCK = "parent_clock"
PARENT = "parent"
CONFINEMENT = "confinement"
AUDIT_HOOK = "audit_hook"
WORKER = "worker"
OBSERVERS: dict[str, str] = {
    STATIC: "the candidate's source, parsed as an AST in the parent before anything of it runs",
    BUILD: "the build and import of the candidate in a confined worker (compiler output, what the module defines)",
    REFERENCE: "the task's reference process, which never imports a candidate and holds the reference outputs",
    PARENT_CLOCK: "the parent's own clock around each timed batch and each export of chosen outputs",
    PARENT: "the parent, after the calls ran: choices it draws then, the replies' protocol, the file seal",
    CONFINEMENT: "the operating system: Landlock on every process of the candidate, or the parent's hash seal",
    AUDIT_HOOK: "the worker's audit hook (PEP 578), installed before the candidate's import",
    WORKER: "the candidate's worker process, around its calls: in reach of its native code, so backed by the"
            " observations outside it",
}

ALL_BACKENDS = frozenset(BACKENDS)
CUTE_ONLY = frozenset({"cute"})
NO_CHECK = "none"  # a cheat fixture's `caught-by` when the protocol itself takes its gain


@dataclass(frozen=True)
class Check:
    """One named check. `exploit`: one line, the cheat a defence defeats ("" for other kinds).
    `reported_as`: for a defence that works by making other checks fire (the memory churn), their
    names; a verdict then shows one of those."""

    name: str
    kind: str  # one of KINDS
    observes: str  # a key of OBSERVERS
    judges: str  # one line: the rule
    exploit: str = ""
    backends: frozenset[str] = ALL_BACKENDS
    reported_as: tuple[str, ...] = ()


def _defence(name: str, observes: str, exploit: str, judges: str, backends: frozenset[str] = ALL_BACKENDS,
             reported_as: tuple[str, ...] = ()) -> Check:
    return Check(name, DEFENCE, observes, judges, exploit, backends, reported_as)


STATIC_DEFENCES = (
    _defence("check_forward_allowlist", STATIC,
             "computing with PyTorch (the reference's op renamed, aliased, behind getattr or a helper) instead of"
             " the candidate's own kernels",
             "forward and the helpers it reaches call only torch allocation, view and query functions",
             OWN_KERNEL_BACKENDS),
    _defence("check_not_model_subclass", STATIC,
             "inheriting or wrapping the reference Model and calling its forward",
             "ModelNew does not subclass Model and nothing outside the reference's class uses it"),
    _defence("check_no_concurrency", STATIC,
             "threads, processes, timers or host callbacks that finish the work outside the timed call",
             "no threading, multiprocessing, subprocess, asyncio, signal timers in Python; no std::thread,"
             " pthread_create, fork or cudaLaunchHostFunc in the kernel source"),
    _defence("check_no_private_streams", STATIC,
             "work on a private or switched CUDA stream, or a graph replay, that the timing's end event does not"
             " wait for",
             "no stream creation, stream switching or graph capture in Python or in the kernel source"),
    _defence("check_no_frame_access", STATIC,
             "reading the judge's frames or heap for the reference's result, the tolerance or the timing record",
             "no sys._getframe, inspect frame functions, gc heap scans, tracers, ctypes.pythonapi or frame attributes"),
    _defence("check_no_globals_write", STATIC,
             "swapping what names resolve to behind the AST's back (globals(), vars(), sys.modules, __builtins__)",
             "no writes into module namespaces other than plain assignments and `global` statements"),
    _defence("check_no_patching", STATIC,
             "changing the rules from inside: torch.allclose, synchronize or perf_counter replaced, TF32 switched on,"
             " NVIDIA_TF32_OVERRIDE set",
             "no assignment, setattr or delattr on imported modules or Model, no os.environ writes, no global-state"
             " setters, no dispatch-mode switches"),
    _defence("check_no_module_cache", STATIC,
             "serving a stored result from a cache keyed on the input's identity or data pointer",
             "no module- or instance-level cache keyed on tensors, id() or data_ptr(), no lru_cache on tensors"),
    _defence("check_no_dynamic_code", STATIC,
             "hiding the real forward from every other static check (exec of a string, a computed import or name)",
             "no exec, eval, compile, unpickled or built code objects, computed imports or computed torch names"),
    _defence("check_has_kernel_source", STATIC,
             "no CUDA kernel of its own (a constant, a precomputed answer, or a Triton kernel) where own kernels"
             " are required",
             "the module holds kernel C++ source with a __global__ function outside comments and strings",
             OWN_KERNEL_BACKENDS),
    _defence("check_uses_cute", STATIC,
             "a \"CuTe\" candidate that is plain CUDA wearing a CuTe include",
             "some kernel source uses CuTe tensors or layouts outside comments and strings", CUTE_ONLY),
)

CORRECTNESS = (
    Check("run_static_checks", FAULT, STATIC, "the candidate's source parses as Python"),
    Check("build_error", FAULT, BUILD,
          "the candidate's kernels compile (the distilled compiler error is the feedback)"),
    Check("build_timeout", FAULT, BUILD, "the build finishes within EvalConfig.build_timeout_s"),
    Check("import_error", FAULT, BUILD, "importing the candidate raises nothing"),
    Check("model_new_missing", FAULT, BUILD, "the module defines class ModelNew at module level"),
    Check("build", EVIDENCE, BUILD, "which kernels were built or found in the cache, and in how long"),
    Check("static", EVIDENCE, STATIC, "summary: no static check had a finding"),
    Check("weights_match", FAULT, REFERENCE,
          "ModelNew's same-named parameters and buffers equal Model's when both are built from the same seed"),
    _defence("check_output_types", WORKER,
             "a tensor subclass or lazy wrapper that answers comparisons with \"equal\", or a cheaper dtype",
             "every output is exactly torch.Tensor with the reference's shape, dtype and device"),
    _defence("check_nonfinite", REFERENCE,
             "outputs of uninitialised memory, or numerically unsafe kernels, hidden by a comparison that skips NaN",
             "no NaN or infinity where the reference is finite"),
    _defence("inputs_mutated", WORKER,
             "computing in place in the caller's input, or rewriting inputs to pass a later comparison",
             "every input the reference leaves unchanged is unchanged after the candidate's call"),
    _defence("compare_outputs", REFERENCE,
             "results that are right only on some calls (cached, stale, partial) or off by more than the reference's"
             " own rounding",
             "|out - ref| <= atol + rtol * |ref| on fresh trials, or no farther from the float64 result than the"
             " reference is"),
    _defence("compare_precision", REFERENCE,
             "arithmetic below fp32 (TF32 or bf16 operands or sums) or coarse approximations whose error hides"
             " under atol on the fp32 track",
             "error from the float64 result within 16x the fp32 reference's own plus 2^-19, no TF32/bf16 rounding"
             " signature, small outputs judged elementwise at their scale"),
    Check("determinism", FAULT, REFERENCE,
          "two calls on identical inputs, with freed memory filled with NaN before each, agree within a tenth of the"
          " tolerance (a race, or a read of memory the candidate never wrote)"),
    _defence("churn_free_memory", WORKER,
             "an output allocated with torch.empty that still holds the reference's result (the \"150x\" of stale"
             " memory), so a kernel that computes part of it passes",
             "free device memory is filled with NaN before the candidate's calls, so what it did not write is wrong",
             reported_as=("check_nonfinite", "compare_outputs", "determinism")),
    Check("float64_reference", EVIDENCE, REFERENCE, "where the reference's float64 result was consulted"),
    Check("adversarial_inputs", EVIDENCE, REFERENCE, "a note on the heavy-tailed trial (skipped, or how it was made)"),
    Check("trivial_solution_probe", EVIDENCE, REFERENCE,
          "which trivial answers (zeros, a constant, a copy of an input) pass the task: a degenerate task is flagged"),
    Check("reference_on_host", EVIDENCE, REFERENCE,
          "the reference's outputs are kept on the host: comparisons are slow"),
    Check("output_transfer", FAULT, REFERENCE,
          "the reference process can read the candidate's outputs (plain tensors)"),
    Check("reference_process_died", FAULT, REFERENCE,
          "the reference process survives reading the candidate's outputs (a forged descriptor can end it)"),
)

ANTICHEAT = (
    _defence("disallowed_ops", WORKER,
             "torch compute reached where the AST cannot see it (Python operators on tensors, operator.matmul)",
             "one forward under a TorchDispatchMode runs only allocation and view aten ops", OWN_KERNEL_BACKENDS),
    _defence("audit_kernels", WORKER,
             "library kernels (cuBLAS, cuDNN, aten) doing the work with the op audit switched off, or own kernels"
             " that never run",
             "a profiled forward launches the candidate's own kernels and no library compute kernel",
             OWN_KERNEL_BACKENDS),
    _defence("ghost_probe", REFERENCE,
             "an answer made ahead of time (a ghost kernel) that ignores the inputs",
             "where a large perturbation of one input element moves the reference's output, it moves the"
             " candidate's"),
    _defence("global_state_changes", WORKER,
             "switching on TF32 or replacing torch or timing functions at import, through private setters",
             "torch flags and the identities of torch and timing functions equal their snapshot from before the"
             " import"),
    _defence("new_threads", WORKER,
             "a thread left running that finishes outputs after the call returns",
             "no thread of the candidate's is alive after its calls"),
    _defence("guard_refused", AUDIT_HOOK,
             "frame access, heap walks, tracing, ctypes, code replacement, processes, threads or signal handlers"
             " from candidate code, however the call is spelled",
             "the audit hook refuses the event to code that is the candidate's; any refusal fails the verdict"),
)

RUN = (
    Check("runtime_error", FAULT, WORKER, "the candidate's calls raise nothing"),
    Check("out_of_memory", FAULT, WORKER, "the candidate's calls fit in device memory"),
    Check("illegal_memory_access", FAULT, WORKER, "the candidate's kernels make no illegal memory access"),
    Check("cuda_error", FAULT, WORKER, "no CUDA error, and the CUDA context is not broken after a call"),
    Check("run_timeout", FAULT, PARENT, "each stage finishes within EvalConfig.run_timeout_s"),
    _defence("worker_crashed", PARENT,
             "ending the worker early (os._exit) so that an ended worker passes for a finished one",
             "a worker that ends before it replies fails the verdict; nothing it measured counts"),
    _defence("worker_protocol", PARENT,
             "a reply written by the candidate itself over the private channel (1-microsecond calls)",
             "every reply echoes the fresh nonce of the command it answers"),
    _defence("write_outside_scratch", CONFINEMENT,
             "writing where a later process reads and runs it (an installed package, a .pth file, the build cache,"
             " another candidate's build, the run directory)",
             "Landlock refuses every write outside the scratch directory; without it, the files the judge imports are"
             " hashed before and after"),
    Check("memory_retry", INFRASTRUCTURE, PARENT,
          "the first attempt ran out of memory the evaluator held; that was freed and the candidate judged again"),
    Check("busy_retry", INFRASTRUCTURE, PARENT,
          "the candidate failed for memory or time while other processes shared the GPU; judged again after a wait"),
    Check("gpu_busy", INFRASTRUCTURE, PARENT,
          "every attempt failed for memory or time while other processes shared the GPU: not the candidate's fault"),
    Check("transfer_space", INFRASTRUCTURE, WORKER,
          "the candidate's outputs did not fit on the working directory's disk as files: not the candidate's fault"),
    Check("reference_failed", INFRASTRUCTURE, REFERENCE,
          "the task's reference process failed in a command of its own (out of memory beside the candidate, say):"
          " not a verdict on the candidate; the run goes on with a new reference process"),
    Check("kernel_audit_unavailable", INFRASTRUCTURE, WORKER,
          "the profiler recorded no device activity in the kernel audit, not even a kernel of the judge's own"
          " (CUPTI did not start): not a verdict on the candidate"),
    Check("environment_poisoned", INFRASTRUCTURE, CONFINEMENT,
          "a file the judge imports was changed by an earlier candidate on a machine without Landlock: nothing is"
          " judged until it is reinstalled"),
)

TIMING = (
    _defence("timed_outputs", REFERENCE,
             "honest only while watched (the correctness calls, an audit), or computing only some timed calls",
             "outputs of timed calls, chosen by the parent after each batch ran, match the reference on those calls'"
             " own fresh inputs"),
    _defence("parent_clock", PARENT_CLOCK,
             "a timing record halved through the heap, the timing function wrapped, or work moved out of the timed"
             " calls",
             "the parent's wall time over each batch, less the calibrated loop cost, is accounted for by the reported"
             " times; no call counts below 0.9 of the batches' mean call (a record reshaped with its sum kept)"),
    _defence("work_past_stream", WORKER,
             "kernels on another stream (driver-API streams, graphs) that outlast the caller's stream and its end"
             " event",
             "most timed calls must not leave the device busy long after the caller's stream finished"),
    _defence("below_output_floor", PARENT,
             "a time under the work bound that no kernel writing the outputs could reach (a forged or skipped write)",
             "the median is no less than writing the outputs once at the GPU's peak bandwidth"),
    Check("beat_work_bound", EVIDENCE, PARENT,
          "faster than the reference's work bound and passed the strongest verification (every call of a further"
          " run checked, the clocks agreeing)"),
    Check("work_bound", EVIDENCE, PARENT, "the median as a fraction of the reference algorithm's work bound"),
    Check("speedup_review", EVIDENCE, PARENT,
          "a speedup over eager above EvalConfig.review_speedup: flagged for review"),
)

CHECKS: tuple[Check, ...] = STATIC_DEFENCES + CORRECTNESS + ANTICHEAT + RUN + TIMING
BY_NAME: dict[str, Check] = {check.name: check for check in CHECKS}


def check(name: str) -> Check:
    """The registry entry of a check name; a KeyError names the registry for an unknown one."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a registered check (cutegen/evaluate/checks.py)") from None


def backends_of(name: str) -> frozenset[str]:
    """The backends check `name` judges."""
    return check(name).backends


def static_check_names() -> tuple[str, ...]:
    """The static defences, in the registry's order (each a `check_*` function of checks_static)."""
    return tuple(c.name for c in STATIC_DEFENCES)


def defences() -> tuple[Check, ...]:
    return tuple(c for c in CHECKS if c.kind == DEFENCE)
