"""Nsight Compute CSV parsing, unit normalisation, multi-kernel totals, diagnosis and the text summary.

Fixtures (tests/fixtures/ncu/, see its README.md):
- synthetic_raw.csv and synthetic_details.csv are SYNTHETIC: hand-made in the documented layouts of
  `ncu --csv --page raw` and `ncu --csv` (the same three launches, printed in different units);
- ncu_*.csv, when present, are RECORDED on the H200 by tests/test_profile_agreement_gpu.py
  (bench/profile_h200.py before it); their tests skip until they are added.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from cutegen.profile.diagnose import build_profile, diagnose, profile_text, short_name, split_own, suggest
from cutegen.profile.metrics import available_metrics, kernel_profile, parse_query_metrics
from cutegen.profile.ncu_csv import Launch, NcuCsvError, parse_ncu_csv, parse_number, unit_scale
from cutegen.profile.sass import parse_sass

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
COPY = "_ZN4demo11copy_kernelEPKfPfl"
REDUCE = "_ZN4demo14reduce_partialEPKfPfi"
FILL_PREFIX = "_ZN2at6native29vectorized_elementwise_kernel"
# The bytes the synthetic fixture's two own launches move: 268.44 MB + 268,435.46 KB + 0.52 MB + 0.53 KB.
OWN_DRAM_BYTES = 268.44e6 + 268_435.46e3 + 0.52e6 + 0.53e3


def synthetic(name: str) -> list[Launch]:
    return parse_ncu_csv((FIXTURES / name).read_text())


def own_profile(launches: list[Launch], **overrides):
    own, others = split_own(launches, [f"...{COPY}...{REDUCE}...".encode()])
    kwargs = dict(task_id="demo", candidate_sha256="0" * 64, tool="ncu test", device_name=None, mixes=(),
                  findings=(), other_kernels=tuple(others), names={COPY: "copy_kernel", REDUCE: "reduce_partial"},
                  workload_class="elementwise", track="fp32", sol_bound_s=None)
    return build_profile(own, **{**kwargs, **overrides})


# ------------------------------------------------------------------------------------------ units


@pytest.mark.parametrize("unit, scale, base", [
    ("nsecond", 1e-9, "second"), ("usecond", 1e-6, "second"), ("msecond", 1e-3, "second"),
    ("second", 1.0, "second"), ("ns", 1e-9, "second"), ("byte", 1.0, "byte"), ("Kbyte", 1e3, "byte"),
    ("Mbyte", 1e6, "byte"), ("Gbyte", 1e9, "byte"), ("Tbyte", 1e12, "byte"), ("KiB", 1024.0, "byte"),
    ("MB", 1e6, "byte"), ("Gbyte/second", 1e9, "byte/second"), ("byte/usecond", 1e6, "byte/second"),
    ("Kbyte/block", 1e3, "byte/block"), ("cycle/nsecond", 1e9, "cycle/second"), ("Ghz", 1e9, "hz"),
    ("%", 1.0, "%"), ("inst", 1.0, "inst"), ("register/thread", 1.0, "register/thread"), ("", 1.0, ""),
])
def test_unit_scale_turns_every_ncu_unit_into_base_units(unit, scale, base):
    got_scale, got_base = unit_scale(unit)
    assert got_scale == pytest.approx(scale) and got_base == base


@pytest.mark.parametrize("text, value", [
    ("1,048,576", 1048576.0), ("268,435.46", 268435.46), ("4.0e-05", 4e-5), ("12", 12.0), ("-3.5", -3.5),
    ('"0.52"', 0.52), ("n/a", None), ("", None), ("(256, 1, 1)", None), ("NVIDIA H200", None), ("1,2", None),
])
def test_parse_number_reads_grouped_and_plain_numbers_only(text, value):
    assert parse_number(text) == value


def test_raw_page_values_are_normalised_per_column_unit():
    launches = synthetic("synthetic_raw.csv")
    assert [l.launch_id for l in launches] == [0, 1, 2]
    copy = launches[0]
    assert copy.kernel_name == COPY and copy.grid_size == "(65536, 1, 1)"
    assert copy.values["gpu__time_duration.sum"] == pytest.approx(120.5e-6)  # usecond column
    assert copy.units["gpu__time_duration.sum"] == "second"
    assert copy.values["dram__bytes_read.sum"] == pytest.approx(268.44e6)  # Mbyte column
    assert copy.values["dram__bytes_write.sum"] == pytest.approx(268_435.46e3)  # Kbyte column, grouped digits
    assert copy.values["launch__grid_size"] == 65536.0
    assert copy.text("device__attribute_display_name") == "NVIDIA H200"
    reduce = launches[1]
    assert "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed" not in reduce.values  # n/a is not a number
    assert reduce.values["launch__shared_mem_per_block_static"] == pytest.approx(4100.0)  # Kbyte/block


def test_details_page_with_per_row_units_gives_the_same_numbers_as_the_raw_page():
    raw, details = synthetic("synthetic_raw.csv"), synthetic("synthetic_details.csv")
    assert [l.kernel_name for l in raw] == [l.kernel_name for l in details]
    for a, b in zip(raw, details):
        assert a.values.keys() == b.values.keys()
        for name, value in a.values.items():
            assert b.values[name] == (pytest.approx(value) if isinstance(value, float) else value), name
    # msecond and nsecond rows in the details page, usecond in the raw page: all seconds now
    assert details[0].values["gpu__time_duration.sum"] == pytest.approx(120.5e-6)
    assert details[1].values["gpu__time_duration.sum"] == pytest.approx(3.5e-6)


def test_text_without_a_header_is_rejected():
    with pytest.raises(NcuCsvError):
        parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")


# ------------------------------------------------------------------------------- kernels and totals


def test_own_kernels_are_told_by_their_libraries_and_framework_kernels_by_name():
    launches = synthetic("synthetic_raw.csv")
    own, others = split_own(launches, [f"xx{COPY}\0{REDUCE}\0".encode()])
    assert [l.kernel_name for l in own] == [COPY, REDUCE] and others[0].startswith(FILL_PREFIX)
    own, others = split_own(launches, [])  # no library (a load_inline candidate): PyTorch's is left out
    assert [l.kernel_name for l in own] == [COPY, REDUCE] and len(others) == 1


def test_several_kernels_are_listed_and_summed():
    profile = own_profile(synthetic("synthetic_raw.csv"), sol_bound_s=110e-6)
    assert [k.name for k in profile.kernels] == [COPY, REDUCE]
    assert profile.other_kernels[0].startswith(FILL_PREFIX)
    assert profile.total_duration_s == pytest.approx(124.0e-6)
    assert profile.total_dram_bytes == pytest.approx(OWN_DRAM_BYTES)
    assert profile.dram_bytes_per_s == pytest.approx(OWN_DRAM_BYTES / 124.0e-6)
    assert profile.sol_fraction == pytest.approx(110 / 124)
    copy, reduce = profile.kernels
    assert copy.dram_bytes_per_s == pytest.approx((268.44e6 + 268_435.46e3) / 120.5e-6)
    assert copy.occupancy_limiter == "block size" and copy.blocks_per_sm_limit == 8
    assert reduce.occupancy_limiter == "registers" and reduce.shared_memory_per_block_bytes == pytest.approx(5124.0)
    assert reduce.dram_throughput_pct is None and reduce.shared_bank_conflicts == 1536
    assert [s.reason for s in copy.stalls] == ["long_scoreboard", "wait"]  # "selected" and zeros left out
    assert [s.reason for s in reduce.stalls][:2] == ["barrier", "long_scoreboard"]


def test_summary_text_has_correct_units_totals_and_diagnosis():
    text = profile_text(own_profile(synthetic("synthetic_raw.csv"), sol_bound_s=110e-6))
    assert ("2 launch(es) of the candidate, 124 us of GPU time, 537 MB DRAM traffic (4.33 TB/s); 1 other kernel(s)"
            " of the forward not counted.") in text
    assert "- copy_kernel: 120 us, grid 65536 x block 256, 32 registers/thread" in text
    assert "- reduce_partial: 3.5 us, grid 132 x block 128, 64 registers/thread, 5.12 KB shared/CTA" in text
    assert "(DRAM 92%: 537 MB at 4.46 TB/s)" in text  # the copy kernel alone
    assert "the kernels reach 89% of it" in text
    assert "Diagnosis: memory-bound (memory 93% (DRAM 92%), compute 18% of peak in copy_kernel)" in text
    assert "DRAM runs at 92% of its peak" in text
    assert FILL_PREFIX not in text
    assert len(text.splitlines()) <= 20


def test_details_page_gives_the_same_summary():
    assert profile_text(own_profile(synthetic("synthetic_details.csv"))) == profile_text(
        own_profile(synthetic("synthetic_raw.csv")))


# ---------------------------------------------------------------------------------------- diagnosis


def _launch(**values: float) -> Launch:
    names = {"duration": "gpu__time_duration.sum", "sm": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
             "mem": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
             "dram": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
             "occ": "sm__warps_active.avg.pct_of_peak_sustained_active",
             "limit_regs": "launch__occupancy_limit_registers", "limit_warps": "launch__occupancy_limit_warps",
             "regs": "launch__registers_per_thread", "waves": "launch__waves_per_multiprocessor",
             "grid": "launch__grid_size", "tensor": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
             "fma": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
             "long_sb": "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
             "barrier": "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"}
    return Launch(0, "k", values={names[k]: float(v) for k, v in values.items()})


@pytest.mark.parametrize("values, expected", [
    (dict(duration=100e-6, sm=20, mem=91, dram=90), "memory-bound"),
    (dict(duration=100e-6, sm=85, mem=40, dram=10), "compute-bound"),
    (dict(duration=100e-6, sm=30, mem=35, dram=20, long_sb=12), "latency-bound"),
    (dict(duration=4e-6, sm=85, mem=40, dram=10), "launch-bound"),
    (dict(duration=100e-6, sm=59.9, mem=59.9), "latency-bound"),
    (dict(duration=100e-6, sm=60, mem=10), "compute-bound"),
])
def test_diagnosis_follows_the_speed_of_light_thresholds(values, expected):
    kernels = (kernel_profile(_launch(**values)),)
    assert diagnose(kernels, values["duration"])[0] == expected


def test_suggestions_are_specific_to_the_measurements():
    def hints(diagnosis, mix=None, workload="elementwise", **values):
        kernels = (kernel_profile(_launch(duration=100e-6, **values)),)
        return " ".join(suggest(kernels, diagnosis, (mix,) if mix else (), workload, "fp32", None))

    scalar = dataclasses.replace(parse_sass((FIXTURES / "sass_swish_scale_cute.txt").read_text())[0], function="k")
    assert "128-bit copy atoms" in hints("memory-bound", scalar, sm=10, mem=70, dram=65)
    assert "DRAM runs at 91%" in hints("memory-bound", sm=10, mem=92, dram=91)
    simt = dataclasses.replace(parse_sass((FIXTURES / "sass_matmul_cute.txt").read_text())[0], function="k")
    assert "3xTF32" in hints("compute-bound", simt, "gemm", sm=80, mem=30, fma=85, tensor=0)
    assert "tensor pipe is at 75%" in hints("compute-bound", simt, "gemm", sm=80, mem=30, tensor=75)
    latency = hints("latency-bound", sm=20, mem=20, occ=20, limit_regs=2, limit_warps=8, regs=168, waves=0.5,
                    grid=66, long_sb=9, barrier=3)
    assert "168 registers/thread" in latency and "0.50 waves" in latency and "long_scoreboard" in latency
    assert "launch overhead" in hints("launch-bound", sm=5, mem=5)


def test_suggestions_speak_the_language_of_the_backend():
    """The cuda backend's profile feedback names plain-CUDA constructs, never CuTe's atoms and layouts,
    so that the ablation of the language keeps the advice alike; the keys of the two vocabularies agree."""
    from cutegen.profile.diagnose import TERMS, _STALL_HINTS
    from cutegen.profile.sass import mix_findings

    assert set(TERMS["cuda"]) == set(TERMS["cute"])
    simt = dataclasses.replace(parse_sass((FIXTURES / "sass_matmul_cute.txt").read_text())[0], function="k")
    scalar = dataclasses.replace(parse_sass((FIXTURES / "sass_swish_scale_cute.txt").read_text())[0], function="k")
    cases = [("memory-bound", scalar, "elementwise", dict(sm=10, mem=70, dram=65)),
             ("compute-bound", simt, "gemm", dict(sm=80, mem=30, fma=85, tensor=0)),
             ("latency-bound", None, "elementwise", dict(sm=20, mem=20, occ=20, limit_regs=2, limit_warps=8, regs=168,
                                                         waves=0.5, grid=66, long_sb=9, barrier=3))]
    cute_words = re.compile(r"Copy_Atom|TiledMMA|Swizzle<|SM80_|\bGMMA\b|ITER mode|CUTE_|\batoms?\b")
    for track in ("fp32", "tf32"):
        texts = [" ".join(suggest((kernel_profile(_launch(duration=100e-6, **v)),), d, (m,) if m else (), w, track,
                                  None, backend)) for d, m, w, v in cases for backend in ("cuda", "cute")]
        texts += [" ".join(mix_findings((simt,), "wgmma mma.sync", "gemm", track, backend)) for backend in ("cuda", "cute")]
        cuda, cute = " ".join(texts[0::2]), " ".join(texts[1::2])
        assert "128-bit loads and stores (float4)" in cuda and "long_scoreboard" in cuda
        assert ("mma.sync.m16n8k8 .tf32" if track == "fp32" else "half-precision mma.sync") in cuda
        assert not cute_words.search(cuda), cuda
        assert cute_words.search(cute)
    for reason, hint in _STALL_HINTS.items():
        assert not cute_words.search(hint.format(**TERMS["cuda"])), reason


def test_short_names_drop_return_type_namespaces_and_parameters():
    assert short_name("void swish_scale_impl::swish_scale_kernel<true>(float const*, float*, long, float)") == \
        "swish_scale_kernel<true>"
    assert short_name("void (anonymous namespace)::k<cute::tuple<int, int> >(int)") == "k<cute::tuple<int, int> >"
    assert short_name("matmul_impl::matmul_kernel(float const*, float const*, float*, int, int, int)") == \
        "matmul_kernel"


def test_query_metrics_output_filters_the_extra_metrics():
    listed = parse_query_metrics("Device NVIDIA H200 (GH100)\n----\nMetric Name   Metric Type  Metric Unit  Description\n"
                                 "dram__bytes_read   Counter   byte   # of bytes read from DRAM\n"
                                 "gpu__time_duration   Counter   nsecond   total duration\n")
    assert listed == {"dram__bytes_read", "gpu__time_duration"}
    wanted = ("dram__bytes_read.sum", "dram__bytes_read.sum.pct_of_peak_sustained_elapsed",
              "lts__t_sector_hit_rate.pct", "launch__registers_per_thread", "device__attribute_display_name")
    keep, missing = available_metrics(wanted, listed)
    assert keep == ("dram__bytes_read.sum", "dram__bytes_read.sum.pct_of_peak_sustained_elapsed",
                    "launch__registers_per_thread", "device__attribute_display_name")
    assert missing == ("lts__t_sector_hit_rate.pct",)
    assert available_metrics(wanted, None) == (wanted, ())


# --------------------------------------------------------------------- recorded on the H200 (when added)

# The sizes the recorded profiles were made at (by bench/profile_h200.py then): float32 tensors of
# 16384 x 4096 (swish, softmax), a 2048^3 GEMM.
# Expected DRAM reads (relative tolerance) and the most that may be written. Writes can fall short of
# the output size: up to an L2's worth of dirty lines (60 MB on the H200) is written back after the
# kernel ends, outside what ncu counts; a 16 MB GEMM output may stay in L2 entirely.
LARGE_BYTES = 16384 * 4096 * 4
GEMM_BYTES = 2048 * 2048 * 4
RECORDED = {"ncu_swish_scale.csv": (LARGE_BYTES, 0.15, LARGE_BYTES, 0.75),
            "ncu_row_softmax.csv": (LARGE_BYTES, 0.15, LARGE_BYTES, 0.75),
            "ncu_matmul.csv": (2 * GEMM_BYTES, 0.25, GEMM_BYTES, 0.0),
            "ncu_softmax_then_swish.csv": None}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_h200_output_parses_with_plausible_units(name):
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"recorded fixture {name} not added yet (tests/test_profile_agreement_gpu.py writes it)")
    launches = parse_ncu_csv(path.read_text())
    assert launches and all(1e-7 < l.values["gpu__time_duration.sum"] < 1.0 for l in launches)  # seconds
    if RECORDED[name] is not None:
        read, rel, written, low = RECORDED[name]
        assert sum(l.values["dram__bytes_read.sum"] for l in launches) == pytest.approx(read, rel=rel)
        assert low * written <= sum(l.values["dram__bytes_write.sum"] for l in launches) <= 1.15 * written
    else:  # two kernels in one forward (softmax, then swish): listed and summed
        profile = build_profile(launches, task_id="x", candidate_sha256="0" * 64, tool="", device_name=None, mixes=(),
                                findings=(), other_kernels=(), names={}, workload_class=None, track="fp32",
                                sol_bound_s=None)
        assert len(profile.kernels) == 2 and len({k.name for k in profile.kernels}) == 2
        assert profile.total_duration_s == pytest.approx(sum(k.duration_s for k in profile.kernels))
        assert profile.total_dram_bytes == pytest.approx(sum(k.dram_bytes for k in profile.kernels))


def test_demangled_kernel_names_are_matched_by_their_mangled_identifier():
    blob = b"\x00_ZN16swish_scale_impl18swish_scale_kernelILb1EEEvPKfPflf\x00"
    launches = [Launch(0, "void swish_scale_impl::swish_scale_kernel<true>(const float *, float *, long, float)"),
                Launch(1, "swish_scale_kernel"),
                Launch(2, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)")]
    own, others = split_own(launches, [blob])
    assert [l.launch_id for l in own] == [0, 1] and others == [launches[2].kernel_name]


def test_a_raw_page_without_a_units_row_keeps_its_first_launch():
    text = ('"ID","Kernel Name","gpu__time_duration.sum"\n'
            '"0","k","1,500"\n'
            '"1","k","2,500"\n')
    assert [l.values["gpu__time_duration.sum"] for l in parse_ncu_csv(text)] == [1500.0, 2500.0]


def test_profile_record_round_trips_through_json():
    from cutegen.journal import from_json
    from cutegen.records import Profile, to_json

    profile = own_profile(synthetic("synthetic_raw.csv"), sol_bound_s=110e-6)
    assert from_json(Profile, json.loads(json.dumps(to_json(profile)))) == profile
