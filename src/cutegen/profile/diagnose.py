"""From measured launches to a Profile: which kernels are the candidate's, the totals, the diagnosis,
what it suggests in the terms of the candidate's language (CuTe, or plain CUDA for the cuda backend:
`TERMS`), and the short text a model reads (`profile_text`).

Diagnosis (of the launch that takes the most time; the totals cover every launch):
- launch-bound: all launches together run for less than LAUNCH_BOUND_S, about what one forward
  costs on the host (argument checks, the launch itself), so nothing inside the kernels matters yet;
- memory-bound / compute-bound: the busiest memory unit (or DRAM) / the busiest SM unit runs at
  BOUND_PCT or more of its peak, and above the other (Nsight Compute's speed-of-light rule of thumb);
- latency-bound: neither reaches BOUND_PCT: warps mostly wait (the stall reasons say on what).
"""

from __future__ import annotations

import re
from typing import Iterable

from cutegen.profile.metrics import kernel_profile
from cutegen.profile.ncu_csv import Launch
from cutegen.records import InstructionMix, KernelProfile, Profile

BOUND_PCT = 60.0
NEAR_PEAK_PCT = 80.0
LAUNCH_BOUND_S = 10e-6
LOW_OCCUPANCY_PCT = 40.0
MAX_SUGGESTIONS = 4
MAX_KERNELS_SHOWN = 6
# How a suggestion names a technique, in the language the candidate is asked for: CuTe's atoms and
# layouts, or the plain-CUDA construct, so that an ablation of the language (cute against cuda) keeps
# the advice alike and the language apart. Backends without an entry (torch) read the CuTe terms.
TERMS: dict[str, dict[str, str]] = {
    "cute": {
        "register_tile": "a smaller per-thread tile (the TiledMMA value layout)",
        "more_vectors": "more vectors per thread: a longer ITER mode in the thread-value layout",
        "swizzle": "swizzle the smem layout (composition(Swizzle<B,M,S>{}, layout)) to remove bank conflicts, read"
                   " with wider or ldmatrix copy atoms",
        "wide_shared": "128-bit or ldmatrix copy atoms",
        "wide_global": "128-bit copy atoms",
        "tensor_unit": "a tensor-core MMA atom for matrix products",
        "gmma_wait": "warpgroup_wait<N> with N > 0",
        "vector_global": "128-bit copy atoms (Copy_Atom<UniversalCopy<uint128_t>, float>) on a thread-value layout"
                         " that gives each thread",
        "mma_peak": "the MMA atom's peak",
        "fp32_route": "3xTF32 (SM80_16x8x8_F32TF32TF32F32_TN on big/small TF32 splits of each operand) keeps fp32"
                      " accuracy",
        "tf32_route": "a TF32 or half-precision MMA atom (SM80 mma.sync, SM90 GMMA)",
        "tensor_lift": "a tensor-core TiledMMA lifts it",
        "bank_fix": "swizzle the smem layout (composition(Swizzle<B,M,S>{}, layout), or a GMMA::Layout_*_SW128 atom)",
        "wgmma_fix": "make the TiledMMA use the SM90 GMMA atom",
        "wgmma_named": "uses wgmma (SM90 GMMA atoms)",
        "mma_sync_named": "names mma.sync atoms (SM80_16x8x8... / SM75...)",
        "fp32_mma_route": "3xTF32 (SM80_16x8x8_F32TF32TF32F32_TN on big/small splits of each operand) is the"
                          " fp32-accurate tensor-core route",
        "tf32_mma_route": "TF32 / half-precision MMA atoms (SM80 mma.sync or SM90 GMMA) would use them",
        "unroll": "CUTE_UNROLL",
    },
    "cuda": {
        "register_tile": "a smaller per-thread tile",
        "more_vectors": "more vectors per thread, all loaded before the first is used",
        "swizzle": "pad or XOR-swizzle the smem rows to remove bank conflicts, read with wider (128-bit) loads or"
                   " ldmatrix",
        "wide_shared": "128-bit loads or ldmatrix",
        "wide_global": "128-bit float4 loads and stores",
        "tensor_unit": "tensor cores (mma.sync, or wgmma on sm_90a) for matrix products",
        "gmma_wait": "wgmma.wait_group N with N > 0",
        "vector_global": "128-bit loads and stores (float4) that give each thread",
        "mma_peak": "the tensor cores' peak",
        "fp32_route": "3xTF32 (mma.sync.m16n8k8 .tf32 on big/small TF32 splits of each operand) keeps fp32 accuracy",
        "tf32_route": "TF32 or half-precision mma.sync (or wgmma on sm_90a) through inline PTX",
        "tensor_lift": "tensor cores lift it",
        "bank_fix": "XOR-swizzle the smem column index",
        "wgmma_fix": "check that the wgmma path is reached",
        "wgmma_named": "uses wgmma",
        "mma_sync_named": "uses mma.sync",
        "fp32_mma_route": "3xTF32 (mma.sync.m16n8k8 .tf32 on big/small splits of each operand) is the fp32-accurate"
                          " tensor-core route",
        "tf32_mma_route": "TF32 / half-precision mma.sync (or wgmma on sm_90a) would use them",
        "unroll": "#pragma unroll",
    },
}


def terms(backend: str) -> dict[str, str]:
    """The vocabulary of suggestions for `backend` (TERMS; CuTe's for a backend without its own)."""
    return TERMS.get(backend, TERMS["cute"])


# Kernels of PyTorch, cuBLAS and cuDNN: left out when the candidate's own kernels cannot be told by
# their libraries (a load_inline candidate).
FRAMEWORK_KERNEL = re.compile(r"^_ZN2at|\bat::|cublas|cudnn|^(?:void )?(?:sm\d+|ampere|volta|turing|hopper)_|xmma"
                              r"|cutlass_\d+|gemmSN|splitKreduce|elementwise_kernel|reduce_kernel", re.I)


# ------------------------------------------------------------------------------------------ kernels


def _symbol_part(name: str) -> bytes:
    """What of a kernel name must occur in the library that holds it: the whole symbol when ncu printed
    it mangled, else the function's identifier as the mangling spells it (length, then the name)."""
    if name.startswith("_Z"):
        return name.encode()
    identifier = re.split(r"[<(]", short_name(name), maxsplit=1)[0].strip()
    return f"{len(identifier)}{identifier}".encode() if identifier else name.encode()


def split_own(launches: list[Launch], library_blobs: list[bytes]) -> tuple[list[Launch], list[str]]:
    """(the candidate's launches, names of the others). A kernel is the candidate's when its symbol
    occurs in one of the candidate's libraries (the cubin names every kernel it holds); without
    libraries, every kernel that does not look like PyTorch's, cuBLAS's or cuDNN's."""
    own, others = [], []
    for launch in launches:
        if library_blobs:
            part = _symbol_part(launch.kernel_name)
            mine = any(part in blob for blob in library_blobs)
        else:
            mine = not FRAMEWORK_KERNEL.search(launch.kernel_name)
        (own if mine else others).append(launch)
    return own, sorted({launch.kernel_name for launch in others})


def short_name(demangled: str) -> str:
    """"void ns::kernel<true>(float const*, int)" -> "kernel<true>" (the function and its template)."""
    text = demangled.strip().replace("(anonymous namespace)::", "")
    text = text[5:] if text.startswith("void ") else text
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
        elif char == "(" and depth == 0:
            text = text[:i]
            break
        elif depth == 0 and text.startswith("::", i):
            start = i + 2
    return text[start:] or demangled


# ---------------------------------------------------------------------------------------- diagnosis


def _dominant(kernels: tuple[KernelProfile, ...]) -> KernelProfile | None:
    timed = [k for k in kernels if k.duration_s is not None]
    return max(timed, key=lambda k: k.duration_s) if timed else (kernels[0] if kernels else None)


def _pct(value: float | None) -> str:
    return f"{value:.0f}%" if value is not None else "n/a"


def diagnose(kernels: tuple[KernelProfile, ...], total_s: float | None) -> tuple[str | None, tuple[str, ...]]:
    """(diagnosis, the measurements behind it); see the module docstring."""
    k = _dominant(kernels)
    if k is None:
        return None, ()
    if total_s is not None and total_s < LAUNCH_BOUND_S:
        return "launch-bound", (f"{len(kernels)} launch(es) run for {format_time(total_s)} in total, less than the"
                                " ~10 us a forward costs on the host",)
    memory = max((v for v in (k.memory_throughput_pct, k.dram_throughput_pct) if v is not None), default=None)
    compute = k.sm_throughput_pct
    if memory is None and compute is None:
        return None, ("no speed-of-light metric was measured",)
    levels = f"memory {_pct(k.memory_throughput_pct)} (DRAM {_pct(k.dram_throughput_pct)}), compute {_pct(compute)}"
    if max(memory or 0.0, compute or 0.0) >= BOUND_PCT:
        kind = "memory-bound" if (memory or 0.0) >= (compute or 0.0) else "compute-bound"
        return kind, (f"{levels} of peak in {k.display_name}",)
    stall = f"; top stall: {k.stalls[0].reason}" if k.stalls else ""
    return "latency-bound", (f"{levels} of peak in {k.display_name}: no unit is busy, warps wait{stall}",)


def _mix_of(kernel: KernelProfile, mixes: Iterable[InstructionMix]) -> InstructionMix | None:
    return next((m for m in mixes if m.function == kernel.name), None)


def _occupancy_hint(k: KernelProfile, t: dict[str, str]) -> str | None:
    if k.achieved_occupancy_pct is None or k.achieved_occupancy_pct >= LOW_OCCUPANCY_PCT or not k.occupancy_limiter:
        return None
    limit = f"{k.blocks_per_sm_limit:g} CTAs/SM" if k.blocks_per_sm_limit is not None else "few CTAs/SM"
    remedy = {"registers": f"{k.registers_per_thread} registers/thread: {t['register_tile']} or"
                           " __launch_bounds__(threads, min_ctas) frees registers",
              "shared memory": "fewer pipeline stages or a smaller CTA tile (BLK_M/BLK_N/BLK_K) frees shared memory",
              "block size": "larger CTAs (more threads) or more CTAs per SM",
              }.get(k.occupancy_limiter, "more resident warps")
    return (f"Occupancy is {k.achieved_occupancy_pct:.0f}% (limited by {k.occupancy_limiter}, {limit}): {remedy};"
            " more resident warps hide more latency.")


def _fill_hint(k: KernelProfile) -> str | None:
    if k.waves_per_sm is None or k.waves_per_sm >= 1.0 or k.grid_size is None:
        return None
    return (f"The grid has {k.grid_size} CTAs, {k.waves_per_sm:.2f} waves: part of the GPU idles. Use smaller CTA"
            " tiles or more CTAs (several per row, split-K for a GEMM).")


# Each stall reason's hint, with the backend's TERMS filled in.
_STALL_HINTS = {
    "long_scoreboard": "Warps wait on global memory (long_scoreboard): issue every load of a tile before using"
                       " any ({more_vectors}), or stage tiles with cp.async/TMA through a 2-4 stage shared-memory"
                       " pipeline.",
    "barrier": "Warps wait at barriers: fewer __syncthreads (reduce within a warp with shuffles first; a"
               " producer/consumer pipeline on mbarriers instead of CTA-wide barriers).",
    "short_scoreboard": "Warps wait on shared memory (short_scoreboard): {swizzle}, reuse each loaded value for"
                        " more FMAs (a larger register tile).",
    "mio_throttle": "The shared-memory/MIO queue is full (mio_throttle): fewer, wider shared accesses"
                    " ({wide_shared}) and a larger per-thread register tile.",
    "lg_throttle": "The global load/store queue is full (lg_throttle): fewer, wider accesses ({wide_global})"
                   " instead of many scalar ones.",
    "math_pipe_throttle": "A math pipe is saturated (math_pipe_throttle): balance FMA against ALU work or move"
                          " the arithmetic to a faster unit ({tensor_unit}).",
    "wait": "Fixed-latency dependencies dominate (wait): more independent work per thread (unrolled loops,"
            " several values per thread) gives the scheduler something to issue.",
    "gmma": "Warps wait for wgmma to finish (gmma): keep more MMAs in flight ({gmma_wait}, more smem stages) so"
            " loads and MMAs overlap.",
}


def _memory_hints(k: KernelProfile, mix: InstructionMix | None, sol_fraction: float | None,
                  t: dict[str, str]) -> list[str]:
    hints = []
    dram = k.dram_throughput_pct or 0.0
    if dram >= NEAR_PEAK_PCT or (sol_fraction is not None and sol_fraction >= NEAR_PEAK_PCT / 100):
        hints.append(f"DRAM runs at {dram:.0f}% of its peak: the bytes already move about as fast as the GPU"
                     " allows; only moving fewer bytes helps (fuse neighbouring ops, read each input once, keep"
                     " intermediates in registers or shared memory).")
    if mix is not None and mix.global_loads and (mix.widest_global_load_bits or 0) < 128:
        hints.append(f"Global loads are at most {mix.widest_global_load_bits}-bit: use {t['vector_global']}"
                     " 4 contiguous, 16-byte aligned floats, so a warp access is one contiguous 512-byte run.")
    if (k.memory_throughput_pct or 0.0) >= BOUND_PCT and dram < BOUND_PCT:
        hints.append("The busy memory unit is L1/L2 or shared memory, not DRAM: data is re-read from cache; load"
                     " each reused tile once into shared memory or registers.")
    return hints


def _compute_hints(k: KernelProfile, mix: InstructionMix | None, workload_class: str | None, track: str,
                   t: dict[str, str]) -> list[str]:
    hints = []
    if k.tensor_pipe_pct is not None and k.tensor_pipe_pct >= BOUND_PCT:
        hints.append(f"The tensor pipe is at {k.tensor_pipe_pct:.0f}%: near {t['mma_peak']}; larger CTA tiles"
                     " (more MMAs per loaded byte) or a cheaper epilogue are what is left.")
    elif mix is not None and mix.tensor_core == 0 and workload_class in ("gemm", "conv", "attention"):
        atom = t["fp32_route"] if track == "fp32" else t["tf32_route"]
        hints.append(f"FFMA on CUDA cores is the ceiling (FMA pipe {_pct(k.fma_pipe_pct)}, ~67 TFLOP/s on H100/H200):"
                     f" {t['tensor_lift']}; {atom}.")
    if k.shared_bank_conflicts:
        hints.append(f"{k.shared_bank_conflicts:.3g} shared-memory bank conflicts: {t['bank_fix']} or pad its"
                     " leading dimension.")
    return hints


def suggest(kernels: tuple[KernelProfile, ...], diagnosis: str | None, mixes: tuple[InstructionMix, ...],
            workload_class: str | None, track: str, sol_fraction: float | None,
            backend: str = "cute") -> tuple[str, ...]:
    """What to try next, in the backend's terms (TERMS), most specific first (at most MAX_SUGGESTIONS)."""
    t = terms(backend)
    k = _dominant(kernels)
    if k is None or diagnosis is None:
        return ()
    if diagnosis == "launch-bound":
        return (f"{len(kernels)} launch(es), {format_time(sum(x.duration_s or 0.0 for x in kernels))} of GPU time:"
                " host and launch overhead dominate; fuse the forward's kernels into one launch and give each"
                " CTA more work. Tuning inside the kernel will not show.",)
    mix = _mix_of(k, mixes)
    hints: list[str] = []
    if diagnosis == "memory-bound":
        hints += _memory_hints(k, mix, sol_fraction, t)
    elif diagnosis == "compute-bound":
        hints += _compute_hints(k, mix, workload_class, track, t)
    hints += [h for h in (_fill_hint(k), _occupancy_hint(k, t)) if h]
    near_peak = diagnosis == "memory-bound" and hints and hints[0].startswith("DRAM runs")
    for stall in k.stalls[:2]:
        if stall.reason in _STALL_HINTS and not near_peak:
            hints.append(_STALL_HINTS[stall.reason].format(**t))
    if diagnosis == "latency-bound" and k.shared_bank_conflicts:
        hints += _compute_hints(k, None, None, track, t)[-1:]
    return tuple(dict.fromkeys(hints))[:MAX_SUGGESTIONS]


# ------------------------------------------------------------------------------------------- profile


def build_profile(launches: list[Launch], *, task_id: str, candidate_sha256: str, tool: str,
                  device_name: str | None, mixes: tuple[InstructionMix, ...], findings: tuple[str, ...],
                  other_kernels: tuple[str, ...], names: dict[str, str], workload_class: str | None, track: str,
                  sol_bound_s: float | None, metrics_missing: tuple[str, ...] = (),
                  wall_s: float | None = None, backend: str = "cute") -> Profile:
    """The Profile of the candidate's own launches (`launches`); `names` maps symbols to short names."""
    kernels = tuple(kernel_profile(launch, names.get(launch.kernel_name)) for launch in launches)
    durations = [k.duration_s for k in kernels]
    total_s = sum(durations) if kernels and None not in durations else None  # type: ignore[arg-type]
    dram = [k.dram_bytes for k in kernels]
    total_bytes = sum(dram) if kernels and None not in dram else None  # type: ignore[arg-type]
    fraction = sol_bound_s / total_s if sol_bound_s is not None and total_s else None
    diagnosis, reasons = diagnose(kernels, total_s)
    device = device_name or next((launch.text("device__attribute_display_name") for launch in launches
                                  if launch.text("device__attribute_display_name")), None)
    return Profile(
        task_id=task_id, candidate_sha256=candidate_sha256, tool=tool, device_name=device, kernels=kernels,
        instruction_mix=mixes, total_duration_s=total_s, total_dram_bytes=total_bytes,
        dram_bytes_per_s=total_bytes / total_s if total_bytes is not None and total_s else None,
        sol_bound_s=sol_bound_s, sol_fraction=fraction, diagnosis=diagnosis, reasons=reasons,
        suggestions=suggest(kernels, diagnosis, mixes, workload_class, track, fraction, backend), findings=findings,
        other_kernels=other_kernels, metrics_missing=metrics_missing, wall_s=wall_s,
    )


# ---------------------------------------------------------------------------------------------- text


def format_time(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def format_bytes(count: float | None) -> str:
    if count is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def format_rate(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "n/a"
    return f"{bytes_per_s / 1e12:.3g} TB/s" if bytes_per_s >= 1e12 else f"{bytes_per_s / 1e9:.3g} GB/s"


def _kernel_lines(k: KernelProfile) -> list[str]:
    shape = f"grid {k.grid_size} x block {k.block_size}" if k.grid_size is not None else "launch shape n/a"
    occupancy = f"occupancy {_pct(k.achieved_occupancy_pct)} achieved of {_pct(k.theoretical_occupancy_pct)}"
    if k.occupancy_limiter:
        occupancy += f" (limit: {k.occupancy_limiter})"
    stalls = ", ".join(f"{s.reason} {s.cycles_per_issue:.2g}" for s in k.stalls[:3]) or "n/a"
    return [
        f"- {k.display_name}: {format_time(k.duration_s)}, {shape}, {k.registers_per_thread} registers/thread,"
        f" {format_bytes(k.shared_memory_per_block_bytes)} shared/CTA",
        f"  SM {_pct(k.sm_throughput_pct)} / memory {_pct(k.memory_throughput_pct)} of peak (DRAM"
        f" {_pct(k.dram_throughput_pct)}: {format_bytes(k.dram_bytes)} at {format_rate(k.dram_bytes_per_s)});"
        f" {occupancy}",
        f"  L1 hit {_pct(k.l1_hit_rate_pct)}, L2 hit {_pct(k.l2_hit_rate_pct)}; top stalls (cycles per instruction):"
        f" {stalls}; tensor pipe {_pct(k.tensor_pipe_pct)}, FMA pipe {_pct(k.fma_pipe_pct)}",
    ]


def _mix_line(mix: InstructionMix, names: dict[str, str]) -> str:
    width = f"{mix.widest_global_load_bits or '-'}/{mix.widest_global_store_bits or '-'}-bit"
    parts = [f"{mix.hgmma} HGMMA", f"{mix.hmma} HMMA", f"{mix.ffma} FFMA", f"global loads/stores up to {width}"]
    parts += [f"{n} {label}" for n, label in ((mix.cp_async, "cp.async"), (mix.ldmatrix, "ldmatrix"),
                                              (mix.tma, "TMA"), (mix.local_memory, "local (spill)")) if n]
    return f"- {names.get(mix.function, mix.function)}: " + ", ".join(parts)


def profile_text(profile: Profile, names: dict[str, str] | None = None) -> str:
    """The short summary a model reads: per-kernel numbers with units, the totals against the speed of
    light, the diagnosis, the compiled code's instruction mix and what to try."""
    names = names or {k.name: k.display_name for k in profile.kernels}
    shown = sorted(profile.kernels, key=lambda k: k.duration_s or 0.0, reverse=True)[:MAX_KERNELS_SHOWN]
    lines = [f"Nsight Compute, one forward on {profile.device_name or 'the GPU'} (clocks not locked, caches"
             f" flushed): {len(profile.kernels)} launch(es) of the candidate, {format_time(profile.total_duration_s)}"
             f" of GPU time, {format_bytes(profile.total_dram_bytes)} DRAM traffic"
             f" ({format_rate(profile.dram_bytes_per_s)})"
             + (f"; {len(profile.other_kernels)} other kernel(s) of the forward not counted." if profile.other_kernels
                else ".")]
    for kernel in shown:
        lines += _kernel_lines(kernel)
    if len(profile.kernels) > len(shown):
        rest = profile.kernels[len(shown):]
        lines.append(f"- and {len(rest)} more launch(es)")
    if profile.sol_bound_s is not None and profile.sol_fraction is not None:
        lines.append(f"Speed of light: the task's bound is {format_time(profile.sol_bound_s)}; the kernels reach"
                     f" {profile.sol_fraction:.0%} of it.")
    if profile.diagnosis:
        lines.append(f"Diagnosis: {profile.diagnosis} ({'; '.join(profile.reasons)}).")
    if profile.instruction_mix:
        own = {k.name for k in profile.kernels}
        mixes = [m for m in profile.instruction_mix if m.function in own] or list(profile.instruction_mix)
        lines.append("Compiled code (static SASS counts):")
        lines += [_mix_line(m, names) for m in mixes[:MAX_KERNELS_SHOWN]]
    lines += [f"Warning: {f}" for f in profile.findings]
    if profile.suggestions:
        lines.append("What to try (CuTe):")
        lines += [f"- {s}" for s in profile.suggestions]
    return "\n".join(lines)
