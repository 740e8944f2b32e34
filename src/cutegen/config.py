"""Typed settings, passed in explicitly.

Only the CLI reads environment variables and turns them into these objects; library code never looks
at `os.environ`, so two configurations can coexist in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cutegen.errors import ConfigError


def default_cache_root() -> Path:
    """Where builds and cached measurements live unless a setting says otherwise."""
    return Path.home() / ".cache" / "cutegen"


@dataclass(frozen=True)
class RuntimeConfig:
    """How CuTe sources are compiled and cached.

    `nvcc`: compiler path; None searches PATH and then /usr/local/cuda/bin.
    `cutlass_include`: a CUTLASS `include/` folder (holding `cute/` and `cutlass/`); None uses the
    headers of the installed `nvidia-cutlass` wheel.
    `arch`: e.g. "sm_90a"; None reads it off the current CUDA device (compile-only use must set it).
    `shared_cache_dir`: a build cache that is read and never written: a build found there is used,
    a new one goes to `cache_dir` (a candidate's worker: only trusted code writes the shared cache,
    evaluate/confine.py).
    """

    cache_dir: Path = field(default_factory=lambda: default_cache_root() / "build")
    shared_cache_dir: Path | None = None
    nvcc: str | None = None
    cutlass_include: Path | None = None
    arch: str | None = None
    nvcc_timeout_s: float = 300.0
    extra_flags: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------------ llm


@dataclass(frozen=True)
class ProviderSettings:
    """How model providers are reached. Keys come from the caller (the CLI reads ANTHROPIC_API_KEY,
    OPENAI_API_KEY, CUTEGEN_OPENAI_COMPATIBLE_API_KEY and CUTEGEN_BASE_URL).

    `base_url`: the server of `openai-compatible:MODEL` when the spec carries no `@URL`.
    `max_retries`: retries of a transient failure (429, 5xx, timeout, dropped connection), with
    exponential backoff from `retry_initial_s` up to `retry_max_s` between tries.
    `price_table`: a JSON file of USD per million tokens whose entries override the built-in table.
    `state_dir`: where `exchange:` (no folder) and relative exchange folders live, and where the
    replay provider logs what it served; the agent sets it to the run directory.
    `replay_delay_s`: a pause before each replayed reply (lets tests interrupt a run mid-call).
    """

    anthropic_api_key: str | None = None
    openai_api_key: str | None = None
    compatible_api_key: str | None = None
    base_url: str | None = None
    timeout_s: float = 600.0
    max_retries: int = 4
    retry_initial_s: float = 2.0
    retry_max_s: float = 60.0
    temperature: float | None = None
    price_table: Path | None = None
    state_dir: Path | None = None
    replay_delay_s: float = 0.0


# ---------------------------------------------------------------------------------------------- agent


@dataclass(frozen=True)
class Budget:
    """Run-wide spending limits; None = no limit. Checked before each new model call or evaluation
    (replayed steps are free: they were paid for when they were recorded)."""

    llm_calls: int | None = None
    tokens: int | None = None  # input + output
    usd: float | None = None
    gpu_s: float | None = None
    wall_s: float | None = None  # summed over the sessions of a resumed run


@dataclass(frozen=True)
class AgentConfig:
    """The generate / repair / optimize workflow of `cutegen.agent`.

    `rounds`: optimization rounds per task (each from the best correct kernel so far).
    `repairs`: repair attempts per failing candidate before starting over from the last good kernel.
    `generations`: fresh `generate` attempts per task while it has no correct kernel.
    `patience`: stop a task after this many rounds in a row without a gain of at least `min_gain`
    (relative: 0.02 = 2% faster than the best so far).
    `profiling`: "none", "immediate" or "delayed:K" (the profile block is withheld for the first K
    optimization rounds).
    `target_sol_fraction`: stop a task once its best kernel reaches this fraction of the reference
    algorithm's work bound and is faster than both baselines (agent._check_finished).
    `max_tokens`: the reply limit of each call; `concurrency`: model calls in flight at once.
    `knowledge_dir`: a folder of workload-class notes (`<class>.md`, `common.md`); None = the pack built
    in for the evaluation backend (knowledge.PACKS).
    `search`: how the tree of candidates is grown (`search_policy`): "single" (one kernel at a time),
    "best-of:N" (N generations side by side, the best correct kept) or "beam:W,K" (each round, K
    proposals from each of the W best kernels, side by side, the W best kept).
    `library`: use the kernel library (library.py): its verified kernels of similar tasks are shown in
    generate and optimize prompts, and every accepted kernel is added to it; False (`--no-library`)
    reads and writes none, and a resumed run keeps that. `library_examples`: at most this many shown
    per prompt (0: none); `library_same_task`: the task's own earlier entries may be shown too.
    """

    rounds: int = 5
    repairs: int = 3
    generations: int = 3
    patience: int = 3
    min_gain: float = 0.02
    profiling: str = "delayed:2"
    target_sol_fraction: float = 0.9
    max_tokens: int = 16384
    concurrency: int = 4
    budget: Budget = field(default_factory=Budget)
    knowledge_dir: Path | None = None
    search: str = "single"
    library: bool = True
    library_examples: int = 2
    library_same_task: bool = False

    def __post_init__(self) -> None:
        for name in ("rounds", "repairs", "patience", "max_tokens", "library_examples"):
            if getattr(self, name) < 0:
                raise ConfigError(f"Agent setting {name}={getattr(self, name)} is negative.", f"Give {name} >= 0.")
        for name in ("generations", "concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"Agent setting {name}={getattr(self, name)} is below 1.", f"Give {name} >= 1.")
        profiling_delay(self.profiling)  # raises ConfigError when malformed
        search_policy(self.search)  # idem

    @property
    def policy(self) -> SearchPolicy:
        return search_policy(self.search)


@dataclass(frozen=True)
class SearchPolicy:
    """A search strategy as the agent runs it: a policy over the tree of candidates in the journal.

    `starts`: generations asked side by side while a task has no correct kernel (the best correct
    one is kept). `width`: kernels kept after each optimization round (the beam). `proposals`:
    optimization proposals asked from each kept kernel per round, each in its own direction.
    """

    starts: int = 1
    width: int = 1
    proposals: int = 1

    @property
    def parallel(self) -> int:
        """The most candidates one task has in flight at once."""
        return max(self.starts, self.width * self.proposals)


SEARCH_HELP = ("Use single (one kernel refined round by round), best-of:N (N generations side by side, e.g."
               " best-of:4) or beam:W,K (K proposals from each of the W best kernels per round, e.g. beam:2,3).")


def search_policy(text: str) -> SearchPolicy:
    """"single" -> (1, 1, 1); "best-of:N" -> (N, 1, 1); "beam:W,K" -> (1, W, K). ConfigError otherwise."""

    kind, _, args = text.strip().lower().partition(":")
    numbers = [a.strip() for a in args.split(",")] if args else []
    arity = {"single": 0, "best-of": 1, "beam": 2}.get(kind)
    if arity is None or len(numbers) != arity or not all(n.isdigit() and int(n) >= 1 for n in numbers):
        raise ConfigError(f"Search strategy {text!r} is not understood (whole numbers of 1 or more are needed).",
                          SEARCH_HELP)
    values = [int(n) for n in numbers]
    if kind == "best-of":
        return SearchPolicy(starts=values[0])
    if kind == "beam":
        return SearchPolicy(width=values[0], proposals=values[1])
    return SearchPolicy()


def profiling_delay(schedule: str) -> int | None:
    """Rounds the profile is withheld for: "none" -> None, "immediate" -> 0, "delayed:K" -> K."""

    text = schedule.strip().lower()
    if text == "none":
        return None
    if text == "immediate":
        return 0
    head, _, tail = text.partition(":")
    if head == "delayed" and tail.isdigit():
        return int(tail)
    raise ConfigError(
        f"Profiling schedule {schedule!r} is not understood.",
        "Use none, immediate, or delayed:K (K optimization rounds without profile feedback, e.g. delayed:2).",
    )


# ------------------------------------------------------------------------------------------ evaluate

TRACKS = ("fp32", "tf32")
# What a candidate's compute may be written in (README "Backends"): "cute" its own CUDA kernels written
# with CuTe, "cuda" its own CUDA kernels in any CUDA C++ (CuTe allowed, not required: other systems'
# kernels, and the CuTe-or-not ablation), "torch" PyTorch ops (tests and ablations of the workflow).
BACKENDS = ("cute", "cuda", "torch")
# The backends whose compute must run in the candidate's own kernels: every "own kernels" check (the
# forward allow-list, the op and kernel audits...) applies to these; the registry of checks says which
# (evaluate/checks.py, read by checks_static.STATIC_CHECK_BACKENDS and anticheat.DYNAMIC_CHECK_BACKENDS).
OWN_KERNEL_BACKENDS = frozenset({"cute", "cuda"})
DEVICES = ("cuda", "cpu")
CONFINEMENTS = ("auto", "hashes")

# atol = rtol per precision track for fp32 tensors, and for half-precision tensors in either track.
TRACK_TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2}
HALF_TOLERANCE = 2e-2
HALF_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class EvalConfig:
    """How a candidate is judged (EVALUATION.md).

    `track`: "fp32" (TF32 off for reference and baselines, atol = rtol = 1e-4) or "tf32" (TF32 on,
    1e-2). `backend`: "cute" requires the candidate's own kernels written with CuTe, "cuda" its own
    CUDA kernels (CuTe optional); "torch" lets it use torch ops (tests and ablations; the op and kernel
    audits are off). `device`: "cpu" only with backend torch.
    `run_timeout_s` bounds each candidate stage in the worker (correctness, anticheat, timing);
    `reference_timeout_s` the reference outputs, which are the task's cost, not the candidate's.
    `atol`/`rtol`: None derives them from the track and the tensors' dtype (`tolerance`).
    `sol_slack`: how far past the hardware's speed-of-light bound (`sol.physical_peaks`, as a
    fraction) a time may be before it is rejected. `review_speedup`: a speedup over
    eager above this is flagged for review (not a failure).
    """

    track: str = "fp32"
    backend: str = "cute"
    device: str = "cuda"
    correctness_trials: int = 5
    adversarial_trials: int = 1
    weight_seeds: int = 2
    timing_trials: int = 100
    warmup_trials: int = 10
    timing_input_sets: int = 3  # the baselines' input sets (cycled); each timed call of a candidate gets its own
    timed_batch_calls: int = 10  # a candidate's timed calls per batch, each batch timed on the parent's clock
    timed_output_checks: int = 1  # calls per batch whose outputs are verified, chosen after the batch ran
    calibration_batches: int = 3  # batches that measure the timing loop's own cost, before the import
    build_timeout_s: float = 300.0
    run_timeout_s: float = 180.0
    reference_timeout_s: float = 900.0  # a huge task drawn on the host (see make_inputs) is slow
    atol: float | None = None
    rtol: float | None = None
    do_timing: bool = True
    eager_baseline: bool = True
    compile_baseline: bool = True
    sol_slack: float = 0.05
    review_speedup: float = 5.0
    # The in-process guard of the candidate's worker (an audit hook installed before the candidate's
    # import that refuses frame, heap, tracing, ctypes and process events to its code, evaluate/guard.py).
    # Off only to prove, in tests, that the layers behind it
    # (the parent's clock, the verification of timed outputs) catch what it would have refused.
    guard: bool = True
    # How the candidate's workers are kept from writing outside their scratch directories
    # (evaluate/confine.py): "auto" (Landlock where the kernel has it, and hashes of what the judge
    # imports where it lacks it or truncation), "hashes" (the hashes alone: a machine whose Landlock
    # is unusable, and the tests of that fallback).
    confinement: str = "auto"
    # New attempts (after waits of 5, 15, 30 s) of a candidate that ran out of memory or time while other
    # processes shared the GPU, before the verdict says `gpu_busy` (evaluate/contention.py).
    busy_retries: int = 3
    cache_dir: Path = field(default_factory=lambda: default_cache_root() / "eval")
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    gpus: tuple[int, ...] = (0,)
    log_tail_bytes: int = 16384

    def __post_init__(self) -> None:
        for name, value, allowed in (("track", self.track, TRACKS), ("backend", self.backend, BACKENDS),
                                     ("device", self.device, DEVICES), ("confinement", self.confinement, CONFINEMENTS)):
            if value not in allowed:
                raise ConfigError(f"Evaluation {name} {value!r} is not one of {', '.join(allowed)}.",
                                  f"Pass --{name} {allowed[0]} (or another of {', '.join(allowed)}).")
        if self.device == "cpu" and self.backend in OWN_KERNEL_BACKENDS:
            raise ConfigError(
                f"Device cpu was asked for with backend {self.backend}; the candidate's own CUDA kernels run"
                " only on a CUDA device.",
                "Use --device cuda on a GPU machine, or --backend torch to judge a torch candidate on CPU.",
            )
        if self.correctness_trials < 1 or self.weight_seeds < 1 or self.timing_trials < 1:
            raise ConfigError(
                "correctness_trials, weight_seeds and timing_trials must each be at least 1.",
                "Raise the setting to 1 or more (defaults: 5, 2 and 100).",
            )
        if not self.gpus:
            raise ConfigError("The GPU list is empty.", "Name at least one GPU index, e.g. 0.")

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(atol, rtol) for outputs compared in `dtype` ("float32", "bfloat16"...), unless overridden."""
        base = HALF_TOLERANCE if dtype in HALF_DTYPES else TRACK_TOLERANCE[self.track]
        return (base if self.atol is None else self.atol, base if self.rtol is None else self.rtol)


# ------------------------------------------------------------------------------------------ executors

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class ExecutorConfig:
    """Where evaluations run (evaluate/executor.py). Machine-local, like the GPU list: not part of an
    evaluation's settings (journal.eval_key), so a run may resume under another executor.

    `kind`: "local" (this machine's evaluation service) or "ray" (one actor per GPU of a Ray cluster).
    `address`: the cluster to join (None: Ray's default, a cluster started on this machine with
    `ray start`, else a new local one). `resource`: the Ray resource one actor takes, one unit each
    (None: "GPU" for device cuda, "CPU" for device cpu; a custom resource lets a CPU cluster stand in
    for GPUs, as the tests do). `actors`: at most this many (None: one per free unit of `resource`).
    `max_retries`: how many times an evaluation lost with its actor (a node or process that died) is
    sent again before the run stops with ClusterError. `actor_evaluations`: evaluations one actor
    takes at once (they build in its CPU pool; one at a time holds its GPU). `cpus_per_actor`: CPUs
    an actor reserves from Ray. `start_timeout_s`: how long to wait for a free unit and for actors
    to start.
    """

    kind: str = "local"
    address: str | None = None
    resource: str | None = None
    actors: int | None = None
    max_retries: int = 2
    actor_evaluations: int = 4
    cpus_per_actor: float = 1.0
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ConfigError(f"Executor {self.kind!r} is not one of {', '.join(EXECUTORS)}.",
                              "Pass --executor local, or --executor ray[:ADDRESS] for a Ray cluster.")
        if self.max_retries < 0 or self.actor_evaluations < 1 or (self.actors is not None and self.actors < 1):
            raise ConfigError(f"Executor settings out of range (max_retries={self.max_retries}, actors={self.actors},"
                              f" actor_evaluations={self.actor_evaluations}).",
                              "Use max_retries >= 0, actors >= 1 (or None) and actor_evaluations >= 1.")


def parse_executor(spec: str, resource: str | None = None) -> ExecutorConfig:
    """`local`, `ray` or `ray:ADDRESS` (e.g. ray:10.0.0.5:6379) as an ExecutorConfig."""

    kind, _, address = spec.strip().partition(":")
    if kind not in EXECUTORS or (kind == "local" and address):
        raise ConfigError(f"Executor {spec!r} is not understood.",
                          "Pass --executor local (this machine) or --executor ray[:ADDRESS] (a Ray cluster,"
                          " e.g. ray:10.0.0.5:6379).")
    return ExecutorConfig(kind=kind, address=address or None, resource=resource)


# -------------------------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class ProfileConfig:
    """How Nsight Compute profiles a candidate (`cutegen profile`, the agent's profile feedback).

    `ncu`, `cuobjdump`: a path or a name on PATH; None searches PATH, then /usr/local/cuda/bin.
    `timeout_s` bounds the whole profiled run (importing torch, building the candidate when it is
    not in the build cache, warm-up, the profiled forward and ncu's replays); the process group is
    killed past it. `warmup`: unprofiled forwards first (lazy module loading, first-call
    allocations). `forwards`: profiled forwards (the summary describes one). `max_launches`: at most
    this many kernel launches are profiled. `extra_metrics`: request the metric list of
    cutegen.profile.metrics on top of the ncu sections (off: sections only, the fallback when this
    ncu rejects a name).
    """

    ncu: str | None = None
    cuobjdump: str | None = None
    timeout_s: float = 180.0
    tool_timeout_s: float = 60.0  # ncu --import, --query-metrics and cuobjdump
    warmup: int = 2
    forwards: int = 1
    max_launches: int = 64
    extra_metrics: bool = True
    seed: int = 0  # inputs and weights of the profiled forward (profiling needs no secret seed)

    def __post_init__(self) -> None:
        if self.forwards < 1 or self.max_launches < 1 or self.warmup < 0 or self.timeout_s <= 0:
            raise ConfigError(
                f"Profile settings out of range (forwards={self.forwards}, max_launches={self.max_launches},"
                f" warmup={self.warmup}, timeout_s={self.timeout_s}).",
                "Use forwards >= 1, max_launches >= 1, warmup >= 0 and a positive timeout.",
            )


# -------------------------------------------------------------------------------------------- library


@dataclass(frozen=True)
class LibraryConfig:
    """The kernel library file (library.py) and the machine that writes to it.

    `path`: the SQLite file (the CLI's default: library.sqlite in the user's cache folder).
    `arch`: where this process's verdicts are measured ("sm_90", "cpu"; None: not known), stored with
    each entry written here; examples measured on another architecture are shown with a note.
    `device_name`: the device's name, stored beside the arch. `busy_timeout_s`: how long one statement
    waits for another writer's lock; `retries`: whole transactions tried again after that, with backoff.
    `max_example_chars`: a kernel longer than this is never put in a prompt.
    """

    path: Path
    arch: str | None = None
    device_name: str | None = None
    busy_timeout_s: float = 30.0
    retries: int = 8
    max_example_chars: int = 24000
