"""The records that flow through the pipeline, all in one place.

Every record is a frozen dataclass. Units are in field names (`median_ms`, `compile_s`, `min_bytes`);
`None` means "not measured" (never 0). Records hold plain values so they serialise to JSON with
`to_json` and back with the matching `from_json`; no catch-all dicts.

Sections: tasks, runtime (builds). Later stages add their records below their own heading.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Workload classes, derived from a trace of the reference (never asked of the model).
WORKLOAD_CLASSES = (
    "gemm",
    "conv",
    "elementwise",
    "reduction",
    "norm",
    "attention",
    "fused_chain",
    "other",
)


def to_json(record: Any) -> Any:
    """A JSON-ready view of a record (dataclasses to dicts, Paths to strings, tuples to lists)."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_json(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, Path):
        return str(record)
    if isinstance(record, (list, tuple)):
        return [to_json(x) for x in record]
    if isinstance(record, dict):
        return {str(k): to_json(v) for k, v in record.items()}
    return record


def from_json(cls: Any, data: Any) -> Any:
    """Rebuild a record (or a nested type: Optional, tuple, Path) from its `to_json` form."""
    origin = typing.get_origin(cls)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        inner = [a for a in typing.get_args(cls) if a is not type(None)]
        return from_json(inner[0], data)
    if origin is tuple:
        return tuple(from_json(typing.get_args(cls)[0], x) for x in data)
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{k: from_json(hints[k], v) for k, v in data.items() if k in known})
    if cls is Path:
        return Path(data)
    if cls is float and isinstance(data, int):
        return float(data)
    return data


# ---------------------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    """A reference program in KernelBench format (`Model`, `get_inputs`, `get_init_inputs`)."""

    task_id: str  # "level1/19" for a suite task, the file stem otherwise
    name: str  # the file stem, e.g. "19_ReLU"
    path: Path
    source: str
    source_sha256: str  # hash of the normalised source: stable across line endings and trailing spaces
    level: int | None = None
    problem_id: int | None = None


@dataclass(frozen=True)
class TaskTrace:
    """What the reference does, found by running it on meta tensors (no real compute, no memory)."""

    aten_ops: tuple[str, ...]  # distinct compute ops in first-seen order (views/allocations left out)
    flops: int | None  # torch.utils.flop_counter total; None when the trace failed
    input_bytes: int | None  # tensors returned by get_inputs()
    param_bytes: int | None  # parameters and buffers of the reference Model
    output_bytes: int | None
    workload_class: str  # one of WORKLOAD_CLASSES
    anchor_op: str | None  # the op that defines the class (most FLOPs, else first compute op)
    error: str | None = None  # why the trace failed, when it did
    output_dtypes: tuple[str, ...] = ()  # floating dtypes of the outputs ("float32", "bfloat16"), first seen first

    @property
    def min_bytes(self) -> int | None:
        """Inputs and weights read once, outputs written once: the traffic no kernel can avoid."""
        parts = (self.input_bytes, self.param_bytes, self.output_bytes)
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------- runtime


@dataclass(frozen=True)
class BuildResult:
    """A compiled shared library, fresh or from the content-addressed cache."""

    library_path: Path
    cache_key: str  # sha256 of (source, flags, arch, toolchain)
    arch: str  # e.g. "sm_90a"
    nvcc_version: str
    cached: bool  # True when no compiler ran
    compile_s: float | None  # None when cached


# ------------------------------------------------------------------------------------------ evaluate

# The stages of a verdict, in order; a verdict stops at the first that fails.
EVAL_STAGES = ("static", "build", "correctness", "anticheat", "timing", "profile")


@dataclass(frozen=True)
class Finding:
    """One anti-cheat or contract problem: which named check found it, and where."""

    check: str  # the name of the check function that found it, e.g. "check_forward_allowlist"
    message: str  # what is wrong, phrased so a model can act on it
    line: int | None = None  # source line in the candidate, when known


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one named check (static, dynamic or protocol step)."""

    name: str
    stage: str  # one of EVAL_STAGES
    passed: bool
    detail: str = ""  # why it failed, or what it measured
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class ErrorStats:
    """How far the candidate's outputs are from the reference's, over all trials."""

    max_abs_error: float
    max_rel_error: float
    rel_l2_error: float
    mismatched_elements: int
    total_elements: int
    atol: float
    rtol: float
    # Elements outside atol + rtol * |ref| that were accepted because they are no farther from the
    # float64 result than the reference itself is, plus that tolerance (compare.compare_outputs).
    within_reference_error: int = 0

    COUNTS: typing.ClassVar[tuple[str, ...]] = ("mismatched_elements", "total_elements", "within_reference_error")


@dataclass(frozen=True)
class TimingStats:
    """The timing protocol's summary of N timed calls (milliseconds)."""

    median_ms: float
    mean_ms: float
    min_ms: float
    iqr_ms: float
    trials: int
    # A candidate's timing only (timing.time_forward): the medians of the time to the end event on the
    # caller's stream and to the idle device, and how many calls were timed to the idle device
    # because device work outlasted the stream. None where not measured (baselines, CPU runs).
    stream_median_ms: float | None = None
    idle_median_ms: float | None = None
    past_stream_trials: int | None = None


@dataclass(frozen=True)
class Verdict:
    """Everything the evaluator decided about one candidate for one task, decided in the parent."""

    task_id: str
    candidate_sha256: str
    track: str  # precision track: "fp32" or "tf32"
    backend: str  # "cute" or "cuda" (own kernels required; cuda: CuTe optional) or "torch"
    passed: bool  # correct, clean, and timed (when timing was asked for)
    stage: str  # the last stage reached (the failing one when passed is False)
    failure: str | None  # name of the failed check, None when passed
    feedback: str  # a short text for a model: what failed and how, or how fast it is
    checks: tuple[CheckResult, ...] = ()
    errors: ErrorStats | None = None
    timing: TimingStats | None = None
    eager: TimingStats | None = None
    compiled: TimingStats | None = None  # torch.compile baseline
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    sol_bound_ms: float | None = None
    sol_fraction: float | None = None  # sol_bound_ms / timing.median_ms (1.0 = at the bound)
    build_s: float | None = None
    gpu_s: float | None = None
    log_tail: str = ""  # bounded tail of the worker's stdout/stderr, for humans
    degenerate: tuple[str, ...] = ()  # trivial solutions (zeros, a constant...) that pass the task
    noise_pct: float | None = None  # spread of the eager baseline timed twice; smaller gains are noise
    needs_review: bool = False  # a speedup above the review threshold (not a failure)
    # The parent's clock over the timed batches / what accounts for it (the worker's reported times plus
    # the calibrated loop cost of each call): near 1.0 for an honest kernel (evaluate/clock.py).
    parent_clock_ratio: float | None = None
    # Faster than the reference algorithm's work bound, and passed the strongest verification.
    beat_work_bound: bool = False
    # Not a verdict on the candidate: the evaluation failed for memory or time while other processes
    # shared the GPU, in every attempt (failure "gpu_busy"); evaluate it again.
    infrastructure: bool = False
    # (step, wall seconds) in first-call order, summed over each step's calls: where an evaluation's
    # time went. Steps: build_pool (the CPU build, off the GPU), queue (waiting for a GPU lane),
    # make_room, reference, baselines, peaks (a task's first evaluation on a lane; with prepared, the
    # lane seconds they took ahead, while the candidate built, counted in gpu_s), worker (waiting for
    # a warm worker), setup, build (import and load), quiet (waiting for spares' CUDA contexts),
    # weights, run_trial, compare, determinism, anticheat, ghost, settle, timing, timed_outputs,
    # kernel_audit. Parts of a step, not added to it again: settle_closing, settle_spares and
    # settle_reference_spare (what settle waited for), timed_outputs_trial (the reference's making of
    # the timed calls' trials). gpu_s is the time the lane was held.
    stage_s: tuple[tuple[str, float], ...] = ()
    # The names of the checks that judged this candidate, in the order they started: those in `checks`
    # and those that record nothing when they pass (each static check, the audit hook, the output types,
    # global state...). Every name, like `failure`, is an entry of the registry (evaluate/checks.py).
    checks_run: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvaluateRetry:
    """An evaluation sent again because the process or node running it died (executor.py), or because
    its verdict was not one on the candidate (Verdict.infrastructure; agent.py); the driver journals
    it (`evaluate_retry`) beside the evaluation's one step."""

    task_id: str
    candidate_sha256: str
    attempt: int  # 1 for the first retry
    reason: str  # what the executor was told (e.g. Ray's actor error)
    where: str  # the node and process that was lost ("the evaluator" for an infrastructure verdict)


@dataclass(frozen=True)
class Baselines:
    """Eager PyTorch and torch.compile times of a task's reference, by the candidates' protocol."""

    task_id: str
    task_sha256: str
    track: str
    device_name: str
    torch_version: str
    eager: TimingStats | None
    eager_repeat: TimingStats | None  # eager timed again in the same run: the measurement noise
    compiled: TimingStats | None  # None when not asked for or when torch.compile failed
    compile_error: str | None = None
    noise_pct: float | None = None  # |eager - eager_repeat| / min of the medians, in percent
    # Wall seconds of the measurement's parts, in their order: the reference (model, inputs,
    # outputs), torch.compile and its first call, the wait for the pool's new spare worker, eager
    # timed twice, the compiled model timed.
    reference_s: float | None = None
    compile_s: float | None = None
    settle_s: float | None = None
    eager_s: float | None = None
    compiled_s: float | None = None
    worker_job: int | None = None  # which job of its worker this was: 1 in a fresh worker (see BaselineWorker)


@dataclass(frozen=True)
class Peaks:
    """Compute and memory peaks of one device, for the speed-of-light bound."""

    device_name: str
    fp32_tflops: float  # fp32 on CUDA cores (SIMT)
    tf32_tflops: float  # TF32 tensor cores, dense
    half_tflops: float  # bf16/fp16 tensor cores, dense
    bandwidth_gb_s: float  # device memory, bytes read + written per second
    measured: tuple[str, ...] = ()  # which fields were measured on the device (the rest: datasheet)


# ------------------------------------------------------------------------------------------------ llm


@dataclass(frozen=True)
class Message:
    """One message of a conversation with a model."""

    role: str  # "system", "user" or "assistant"
    content: str


@dataclass(frozen=True)
class Request:
    """One call to a model: the whole message list, and what places the call within its run.

    `task_id`, `stage` and `seq` are never sent to the model; they label exchange files, match
    replayed replies, and enter the request hash so that the same prompt asked twice is two calls.
    """

    messages: tuple[Message, ...]
    max_tokens: int
    task_id: str
    stage: str  # "generate", "repair_build", "repair_correctness", "optimize" or "directions"
    seq: int  # index of this call among the task's calls: 0, 1, 2...


@dataclass(frozen=True)
class Reply:
    """What a provider answered, with its cost. `recorded` marks replayed replies (not a live model)."""

    text: str
    provider: str  # "anthropic", "openai", "openai-compatible", "exchange" or "replay"
    model: str  # the model that answered, as the provider names it
    request_sha256: str
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None  # None when the model has no entry in the price table
    latency_s: float | None
    truncated: bool  # the reply stopped at max_tokens
    attempts: int = 1  # HTTP calls made, retries included
    recorded: bool = False  # True for replayed replies: never present them as a model's results


# ---------------------------------------------------------------------------------------------- agent


@dataclass(frozen=True)
class Candidate:
    """A candidate source extracted from a reply, content-addressed by its normalised text."""

    sha256: str
    source: str  # normalised (cutegen.tasks.normalize_source)


@dataclass(frozen=True)
class Step:
    """One agent step: a model call, the candidate it gave (or why none) and the verdict on it.

    The steps of a task form its search tree: `parent_sha256` is the candidate the step started from
    (the kernel an optimization was asked of, the candidate a repair fixes; None for a generation),
    `idea` the model's own one-line summary of what it tried, `direction` the direction the prompt
    assigned (side-by-side proposals only). Several steps of one batch may be `improved`: each beat
    the best kernel the batch started from; the task's best is the fold of `bench.best_flags`.
    """

    task_id: str
    index: int  # 0, 1, 2... within the task
    stage: str  # "generate", "repair_build", "repair_correctness" or "optimize"
    round: int  # optimize round, 1-based; 0 before the first correct kernel
    request_sha256: str
    prompt_path: str  # relative to the run directory, like every path in a journal
    reply_path: str | None
    candidate_sha256: str | None
    candidate_path: str | None
    bad_reply: str | None  # why the reply gave no candidate; None when it did
    verdict: Verdict | None
    eval_key: str | None  # sha256 of (candidate, task, evaluation config): the evaluation cache key
    profile_shown: bool  # the prompt carried the profile block
    improved: bool = False  # faster than the task's best when this step's batch began (single: the new best)
    log_path: str | None = None  # the evaluator's log tail (the verdict's log_tail is stored there)
    parent_sha256: str | None = None
    idea: str | None = None
    direction: str | None = None


@dataclass(frozen=True)
class TaskResult:
    """Where one task of a run stands: its best correct candidate and what it cost."""

    task_id: str
    status: str  # "done", "waiting" (for a reply), "needs_gpu" or "running"
    stop_reason: str | None
    best_sha256: str | None
    best_median_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    sol_fraction: float | None
    steps: int
    rounds: int
    llm_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    gpu_s: float


# ---------------------------------------------------------------------------------------------- bench


@dataclass(frozen=True)
class TrajectoryPoint:
    """One agent step of a task, as the report plots it (speedup by step, with stage markers)."""

    index: int  # the step's index within the task
    stage: str  # "generate", "repair_build", "repair_correctness" or "optimize"
    round: int  # optimize round, 0 before the first correct kernel
    passed: bool
    speedup_vs_eager: float | None  # of this step's candidate (None unless it passed and was timed)
    best_speedup_vs_eager: float | None  # of the task's best kernel after this step
    profile_shown: bool  # the step's prompt carried profiler feedback
    improved: bool  # this step's candidate became the task's best
    outcome: str  # "passed", "failed at <stage>: <check>" or "unusable reply"
    # The search tree and what had been spent on the task when the step was recorded (None in
    # results written before cutegen recorded them).
    candidate_sha256: str | None = None
    parent_sha256: str | None = None
    idea: str | None = None
    llm_calls: int | None = None  # model calls of the task so far, this one included
    gpu_s: float | None = None  # GPU seconds of the task so far (evaluations and profiles)


@dataclass(frozen=True)
class BenchTaskResult:
    """The result of one task (or one candidate sample of it) in a suite run.

    `level`, `problem_id`, `sample_id`, `compiled`, `correctness`, `runtime` and `ref_runtime` carry
    KernelBench's field names and meanings: `runtime` and `ref_runtime` are mean times in
    microseconds (the candidate's and eager PyTorch's), as KernelBench records them; every other
    time is in the unit its name says. `correctness` is the evaluator's verdict: correct, clean of
    anti-cheat findings, and timed.
    """

    task_id: str
    name: str  # the task file stem
    level: int | None
    problem_id: int | None
    sample_id: int | None  # the candidate file's sample id (--evaluate); None for an agent's best kernel
    compiled: bool  # a candidate built and imported
    correctness: bool
    runtime: float | None  # microseconds, mean (KernelBench)
    ref_runtime: float | None  # microseconds, mean of eager PyTorch (KernelBench)
    status: str  # "done", "unfinished" (the agent had not ended the task) or "missing" (no candidate file)
    stage_reached: str  # furthest evaluation stage of any candidate, "passed", "no_candidate" or "not_started"
    failure: str | None  # the failed check of the furthest-reaching candidate, when none passed
    median_ms: float | None
    eager_median_ms: float | None
    compile_median_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    sol_fraction: float | None
    needs_review: bool
    degenerate: tuple[str, ...]  # trivial solutions the evaluator's probe found passing the task
    excluded: tuple[str, ...]  # why the task is outside the clean subset (empty: inside)
    candidate_sha256: str | None
    candidate_path: str | None  # relative to the run directory
    stop_reason: str | None
    steps: int
    rounds: int
    llm_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    gpu_s: float
    trajectory: tuple[TrajectoryPoint, ...] = ()


@dataclass(frozen=True)
class GroupSummary:
    """Suite metrics over one group of tasks (all, a level, the clean subset...).

    fast_p (KernelBench): the fraction of the group's tasks whose kernel is correct AND faster than
    the baseline by more than p (speedup > p); fast_0 is the correct fraction. A task with no measured
    baseline counts as not fast against it. Means are over the correct tasks that have a measured
    speedup (`speedups_eager` / `speedups_compile` of them); the geometric mean is the one to quote.
    fast_p against a baseline is None when no task of the group had that baseline measured.
    """

    group: str  # "all", "level1", "clean", "clean level1"...
    tasks: int
    compiled: int
    correct: int
    fast_0: float | None  # None for an empty group
    fast_1_eager: float | None
    fast_2_eager: float | None
    fast_1_compile: float | None
    fast_2_compile: float | None
    speedups_eager: int
    mean_speedup_eager: float | None
    geomean_speedup_eager: float | None
    speedups_compile: int
    mean_speedup_compile: float | None
    geomean_speedup_compile: float | None
    median_sol_fraction: float | None
    llm_calls: int
    cost_usd: float
    gpu_s: float


@dataclass(frozen=True)
class BenchRun:
    """A suite run as reports read it: where it came from, how it was judged, and its results.

    `agent` and `evaluation` are the AgentConfig and judgement-relevant EvalConfig fields as the run
    recorded them (JSON); `manifest` is `cutegen.manifest.machine_manifest()` of the machine that
    wrote the results.
    """

    run_id: str
    kind: str  # "agent" (the agent over a suite) or "evaluate" (existing candidate files judged)
    path: Path
    model: str | None  # provider spec of an agent run
    recorded: bool  # the replies were replayed recordings, not a live model's output
    suite: str | None  # the suite path as given
    suite_commit: str | None
    tasks_sha256: str  # hash of the task ids and sources: the exact task set
    agent: dict
    evaluation: dict
    tolerance: dict
    manifest: dict
    results: tuple[BenchTaskResult, ...]
    summary: tuple[GroupSummary, ...]


# -------------------------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class StallReason:
    """One warp-stall reason of a kernel, as Nsight Compute names it (e.g. "long_scoreboard")."""

    reason: str
    cycles_per_issue: float  # warp cycles spent stalled for this reason per issued instruction


@dataclass(frozen=True)
class KernelProfile:
    """Nsight Compute metrics of one kernel launch, in base units (seconds, bytes, percent)."""

    launch_id: int  # ncu's launch index within the profiled range
    name: str  # the kernel's symbol as ncu reports it (mangled)
    display_name: str  # a short readable name
    duration_s: float | None
    sm_throughput_pct: float | None  # compute speed of light (busiest SM unit, % of peak)
    memory_throughput_pct: float | None  # memory speed of light (busiest memory unit, % of peak)
    dram_throughput_pct: float | None
    dram_read_bytes: float | None
    dram_write_bytes: float | None
    achieved_occupancy_pct: float | None
    theoretical_occupancy_pct: float | None
    occupancy_limiter: str | None  # "registers", "shared memory", "block size", "blocks per SM", "barriers"
    blocks_per_sm_limit: float | None  # the limiter's value (resident CTAs per SM)
    registers_per_thread: int | None
    block_size: int | None
    grid_size: int | None
    shared_memory_per_block_bytes: float | None
    waves_per_sm: float | None
    l1_hit_rate_pct: float | None
    l2_hit_rate_pct: float | None
    shared_bank_conflicts: float | None  # shared-memory load + store bank conflicts
    issue_active_pct: float | None  # cycles an instruction issued, % of active cycles
    warp_cycles_per_issue: float | None  # average cycles between two instructions of a warp
    stalls: tuple[StallReason, ...]  # largest first (the "selected" pseudo-stall left out)
    tensor_pipe_pct: float | None  # tensor-core pipe utilisation (mma.sync and wgmma), % of peak
    fma_pipe_pct: float | None  # FP32 FMA pipe utilisation, % of peak
    instructions_executed: float | None  # warp-level SASS instructions
    ffma_thread_instructions: float | None  # thread-level FFMA instructions (2 FLOPs each)

    @property
    def dram_bytes(self) -> float | None:
        parts = (self.dram_read_bytes, self.dram_write_bytes)
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]

    @property
    def dram_bytes_per_s(self) -> float | None:
        total = self.dram_bytes
        return total / self.duration_s if total is not None and self.duration_s else None


@dataclass(frozen=True)
class InstructionMix:
    """Static SASS instruction counts of one kernel function (`cuobjdump -sass`): instructions in the
    code, not executed ones. Tells which pipes the compiled code can use (tensor cores or FFMA only),
    how wide its memory accesses are, and whether it spills."""

    function: str  # the mangled symbol
    instructions: int
    hgmma: int  # warpgroup MMA (wgmma, sm_90a only)
    hmma: int  # warp-level MMA (mma.sync: fp16, bf16, tf32)
    other_mma: int  # integer, fp64, binary and fp8 MMAs (IMMA, DMMA, BMMA, IGMMA, QGMMA...)
    ffma: int
    fp32_other: int  # FADD and FMUL
    global_loads: int
    global_stores: int
    widest_global_load_bits: int | None  # 32, 64 or 128; None when there is no global load
    widest_global_store_bits: int | None
    shared_loads: int
    shared_stores: int
    ldmatrix: int  # LDSM
    cp_async: int  # LDGSTS (global -> shared without registers)
    tma: int  # UTMALDG / UTMASTG / UBLKCP (Hopper bulk copies)
    local_memory: int  # LDL / STL: register spills or local arrays
    shuffles: int
    barriers: int

    @property
    def tensor_core(self) -> int:
        return self.hgmma + self.hmma + self.other_mma


@dataclass(frozen=True)
class Profile:
    """What Nsight Compute measured on one forward of a candidate, with a diagnosis in CuTe terms."""

    task_id: str
    candidate_sha256: str
    tool: str  # the ncu version line
    device_name: str | None
    kernels: tuple[KernelProfile, ...]  # the candidate's own launches, in launch order
    instruction_mix: tuple[InstructionMix, ...]  # per kernel function of the candidate's libraries
    total_duration_s: float | None  # sum over the launches
    total_dram_bytes: float | None
    dram_bytes_per_s: float | None  # total DRAM bytes / total duration
    sol_bound_s: float | None  # the task's speed-of-light bound
    sol_fraction: float | None  # sol_bound_s / total_duration_s (1.0 = at the bound)
    diagnosis: str | None  # "memory-bound", "compute-bound", "latency-bound" or "launch-bound"
    reasons: tuple[str, ...]  # the measurements behind the diagnosis
    suggestions: tuple[str, ...]  # what to try next, in CuTe terms
    findings: tuple[str, ...]  # instruction-mix warnings (e.g. wgmma compiled away)
    other_kernels: tuple[str, ...] = ()  # kernels in the profiled range that are not the candidate's
    metrics_missing: tuple[str, ...] = ()  # requested metrics this ncu/GPU does not have
    wall_s: float | None = None


# -------------------------------------------------------------------------------------------- library


@dataclass(frozen=True)
class TaskSignature:
    """What a task computes, as the kernel library compares tasks (library.py): the traced op sequence
    and workload class (trace.py), the shapes and dtypes of its inputs and outputs, and its non-tensor
    arguments. Found on the meta device, like the trace: no memory, no arithmetic."""

    op_class: str  # the workload class (WORKLOAD_CLASSES)
    aten_ops: tuple[str, ...]  # distinct compute ops, first seen first
    anchor_op: str | None
    input_shapes: tuple[tuple[int, ...], ...]  # the tensors of get_inputs(), in order
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    params: tuple[str, ...]  # non-tensor constructor and forward arguments, as repr() text
    flops: int | None
    min_bytes: int | None


@dataclass(frozen=True)
class KernelMeasurement:
    """What the evaluator measured of an accepted kernel on its task (medians; None: not measured)."""

    median_ms: float | None
    eager_median_ms: float | None
    compile_median_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    sol_fraction: float | None  # of the reference algorithm's work bound
    sol_bound_ms: float | None
    feedback: str  # the verdict's summary, as the evaluator wrote it


@dataclass(frozen=True)
class Provenance:
    """Where a library entry came from."""

    origin: str  # "eval", "agent", "bench --evaluate", "import", or the results file it was read from
    model: str | None  # the provider spec of the run that wrote it (None: not a model's kernel, or unknown)
    run_id: str | None
    added_utc: str  # ISO 8601, when it entered the library
    cutegen_version: str


@dataclass(frozen=True)
class LibraryEntry:
    """One accepted kernel in the library: its task, its source, where and how it was judged and what
    was measured. `content_sha256` is the candidate's hash (sha256 of the normalised source); one
    kernel judged on one task, backend, architecture and track is one entry."""

    content_sha256: str
    task_id: str
    task_name: str
    task_sha256: str
    signature: TaskSignature
    source: str
    backend: str  # the evaluation backend it passed under: "cute", "cuda" or "torch"
    track: str  # the precision track: "fp32" or "tf32"
    arch: str  # where it was measured: "sm_90", "cpu", or "unknown"
    device_name: str | None  # e.g. "NVIDIA H200"; None when not recorded
    measured: KernelMeasurement
    provenance: Provenance
    verdict: Verdict | None = None  # the whole verdict (its log tail left out), when it was kept
    entry_id: int | None = None  # the row id once stored


@dataclass(frozen=True)
class LibraryExample:
    """A library kernel as a prompt shows it. Journaled per task when the task starts (kind
    `library_examples`), so that a resumed run shows the same examples and asks the same requests."""

    entry_id: int
    task_id: str
    op_class: str
    aten_ops: tuple[str, ...]
    shapes: str  # "inputs (128, 4096) float32 -> outputs (128, 4096) float32"
    backend: str
    source: str
    speed: str  # what was measured, in words, with the device and track
    note: str | None = None  # a caveat: measured on another architecture than this run's
