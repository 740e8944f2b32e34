"""The fixed metric set of a profile, and how one launch's metrics become a KernelProfile.

Collection is two-layered, for robustness across ncu versions: the ncu *sections* below (shipped with
ncu, so always valid for it) give speed of light, launch statistics, occupancy, warp states and the
compute/memory workload tables; `EXTRA_METRICS` adds the counters the summary wants that the sections
may not carry (DRAM bytes, hit rates, bank conflicts, pipe utilisation, instruction counts). Names
drift between ncu versions and GPUs, so the extras are first checked against `ncu --query-metrics`
(`available_metrics`) and every field below is read from the first of several spellings that is
present. A field none of whose spellings was measured is None, never a guess.
"""

from __future__ import annotations

import re

from cutegen.profile.ncu_csv import Launch
from cutegen.records import KernelProfile, StallReason

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "ComputeWorkloadAnalysis",
            "MemoryWorkloadAnalysis")

# The warp-stall reasons of sm_70 and later (sm_90 adds gmma); one ratio metric each.
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
_STALL_PATTERN = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")

# Each field of KernelProfile and the metric spellings it is read from, first present wins.
DURATION = ("gpu__time_duration.sum",)
SM_PCT = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
MEMORY_PCT = ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",)
DRAM_PCT = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed")
DRAM_READ_PCT = ("dram__bytes_read.sum.pct_of_peak_sustained_elapsed",)
DRAM_WRITE_PCT = ("dram__bytes_write.sum.pct_of_peak_sustained_elapsed",)
DRAM_READ = ("dram__bytes_read.sum",)
DRAM_WRITE = ("dram__bytes_write.sum",)
ACHIEVED_OCC = ("sm__warps_active.avg.pct_of_peak_sustained_active",)
THEORETICAL_OCC = ("sm__maximum_warps_per_active_cycle_pct",)
REGISTERS = ("launch__registers_per_thread",)
BLOCK = ("launch__block_size",)
GRID = ("launch__grid_size",)
SMEM_TOTAL = ("launch__shared_mem_per_block",)
SMEM_STATIC = ("launch__shared_mem_per_block_static",)
SMEM_DYNAMIC = ("launch__shared_mem_per_block_dynamic",)
WAVES = ("launch__waves_per_multiprocessor",)
L1_HIT = ("l1tex__t_sector_hit_rate.pct",)
L2_HIT = ("lts__t_sector_hit_rate.pct",)
BANK_LD = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",)
BANK_ST = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",)
ISSUE_ACTIVE = ("smsp__issue_active.avg.pct_of_peak_sustained_active",)
WARP_CPI = ("smsp__average_warp_latency_per_inst_issued.ratio", "smsp__average_warps_active_per_issue_active.ratio")
TENSOR_PIPES = ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active")
FMA_PIPE = ("sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
            "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active")
INSTRUCTIONS = ("smsp__inst_executed.sum", "sm__inst_executed.sum")
FFMA = ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum")
DEVICE_NAME = "device__attribute_display_name"

# Occupancy limits (resident CTAs per SM allowed by each resource) and their names in the summary.
OCCUPANCY_LIMITS = (("launch__occupancy_limit_registers", "registers"),
                    ("launch__occupancy_limit_shared_mem", "shared memory"),
                    ("launch__occupancy_limit_warps", "block size"),
                    ("launch__occupancy_limit_blocks", "blocks per SM"),
                    ("launch__occupancy_limit_barriers", "barriers"))

EXTRA_METRICS = (
    *DURATION, *SM_PCT, *MEMORY_PCT, *DRAM_PCT, *DRAM_READ_PCT, *DRAM_WRITE_PCT, *DRAM_READ, *DRAM_WRITE,
    *ACHIEVED_OCC, *THEORETICAL_OCC, *REGISTERS, *BLOCK, *GRID, *SMEM_STATIC, *SMEM_DYNAMIC, *WAVES,
    *(name for name, _ in OCCUPANCY_LIMITS[:4]), *L1_HIT, *L2_HIT, *BANK_LD, *BANK_ST, *ISSUE_ACTIVE,
    *WARP_CPI, *TENSOR_PIPES, *FMA_PIPE, *INSTRUCTIONS, *FFMA, DEVICE_NAME,
    *(STALL_METRIC.format(reason) for reason in STALL_REASONS),
)
# The last resort when ncu rejects the full request: one section and counters every ncu since 2020 has.
FALLBACK_SECTIONS = ("SpeedOfLight",)
FALLBACK_METRICS = (*DURATION, *DRAM_READ, *DRAM_WRITE, *ACHIEVED_OCC, *REGISTERS, *BLOCK, *GRID)
# Launch statistics and device attributes are not hardware counters and are not always listed by
# `ncu --query-metrics`; these are requested without that check.
UNLISTED_PREFIXES = ("launch__", "device__")
_METRIC_NAME = re.compile(r"^([a-z][a-z0-9]*__[a-z0-9_]+)\b")


def base_name(metric: str) -> str:
    """"dram__bytes_read.sum.pct_of_peak_sustained_elapsed" -> "dram__bytes_read"."""
    return metric.split(".", 1)[0]


def parse_query_metrics(text: str) -> frozenset[str]:
    """The base metric names listed by `ncu --query-metrics` (one per line, name first)."""
    return frozenset(m.group(1) for line in text.splitlines() if (m := _METRIC_NAME.match(line.strip())))


def available_metrics(wanted: tuple[str, ...], listed: frozenset[str] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(requested, missing): the wanted metrics whose base name this ncu lists (all when the list is
    unknown), and those it does not."""
    if listed is None:
        return wanted, ()
    keep = tuple(m for m in wanted if m.startswith(UNLISTED_PREFIXES) or base_name(m) in listed)
    return keep, tuple(m for m in wanted if m not in keep)


def _int(value: float | None) -> int | None:
    return int(round(value)) if value is not None else None


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def stalls(launch: Launch, top: int = 4) -> tuple[StallReason, ...]:
    """The largest stall reasons (cycles per issued instruction), "selected" (issuing) left out."""
    found = []
    for name, value in launch.values.items():
        match = _STALL_PATTERN.match(name)
        if match and isinstance(value, float) and match.group(1) != "selected" and value > 0:
            found.append(StallReason(match.group(1), value))
    found.sort(key=lambda s: s.cycles_per_issue, reverse=True)
    return tuple(found[:top])


def occupancy_limit(launch: Launch) -> tuple[str | None, float | None]:
    """The resource that allows the fewest resident CTAs per SM, and that number."""
    limits = [(launch.number(metric), label) for metric, label in OCCUPANCY_LIMITS]
    present = [(value, label) for value, label in limits if value is not None]
    if not present:
        return None, None
    value, label = min(present, key=lambda item: item[0])
    return label, value


def _dram_pct(launch: Launch) -> float | None:
    direct = launch.number(*DRAM_PCT)
    return direct if direct is not None else _sum(launch.number(*DRAM_READ_PCT), launch.number(*DRAM_WRITE_PCT))


def kernel_profile(launch: Launch, display_name: str | None = None) -> KernelProfile:
    """One launch's metrics as a KernelProfile (see the module docstring for the spellings)."""
    smem = launch.number(*SMEM_TOTAL)
    if smem is None:
        smem = _sum(launch.number(*SMEM_STATIC), launch.number(*SMEM_DYNAMIC))
    limiter, limit_value = occupancy_limit(launch)
    tensor = [v for v in (launch.number(name) for name in TENSOR_PIPES) if v is not None]
    return KernelProfile(
        launch_id=launch.launch_id, name=launch.kernel_name, display_name=display_name or launch.kernel_name,
        duration_s=launch.number(*DURATION), sm_throughput_pct=launch.number(*SM_PCT),
        memory_throughput_pct=launch.number(*MEMORY_PCT), dram_throughput_pct=_dram_pct(launch),
        dram_read_bytes=launch.number(*DRAM_READ), dram_write_bytes=launch.number(*DRAM_WRITE),
        achieved_occupancy_pct=launch.number(*ACHIEVED_OCC), theoretical_occupancy_pct=launch.number(*THEORETICAL_OCC),
        occupancy_limiter=limiter, blocks_per_sm_limit=limit_value,
        registers_per_thread=_int(launch.number(*REGISTERS)), block_size=_int(launch.number(*BLOCK)),
        grid_size=_int(launch.number(*GRID)), shared_memory_per_block_bytes=smem,
        waves_per_sm=launch.number(*WAVES), l1_hit_rate_pct=launch.number(*L1_HIT),
        l2_hit_rate_pct=launch.number(*L2_HIT),
        shared_bank_conflicts=_sum(launch.number(*BANK_LD), launch.number(*BANK_ST)),
        issue_active_pct=launch.number(*ISSUE_ACTIVE), warp_cycles_per_issue=launch.number(*WARP_CPI),
        stalls=stalls(launch), tensor_pipe_pct=max(tensor) if tensor else None,
        fma_pipe_pct=launch.number(*FMA_PIPE), instructions_executed=launch.number(*INSTRUCTIONS),
        ffma_thread_instructions=launch.number(*FFMA),
    )
