"""The records that flow through the pipeline, all in one place.

Every record is a frozen dataclass. Units are in field names (`median_ms`, `compile_s`, `min_bytes`);
`None` means "not measured" (never 0). Records hold plain values so they serialise to JSON with
`to_json` and back with the matching `from_json`; no catch-all dicts.

Sections: tasks, runtime (builds). Later stages add their records below their own heading.
"""

from __future__ import annotations

import dataclasses
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


@dataclass(frozen=True)
class TimingStats:
    """The timing protocol's summary of N timed calls (milliseconds)."""

    median_ms: float
    mean_ms: float
    min_ms: float
    iqr_ms: float
    trials: int


@dataclass(frozen=True)
class Verdict:
    """Everything the evaluator decided about one candidate for one task, decided in the parent."""

    task_id: str
    candidate_sha256: str
    track: str  # precision track: "fp32" or "tf32"
    backend: str  # "cute" (own kernels required) or "torch"
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
    stage: str  # "generate", "repair_build", "repair_correctness" or "optimize"
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
    """One agent step: a model call, the candidate it gave (or why none) and the verdict on it."""

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
    improved: bool = False  # this candidate became the task's best


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
