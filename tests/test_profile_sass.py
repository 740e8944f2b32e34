"""The SASS instruction mix, on real `cuobjdump -sass` output kept in tests/fixtures/ncu/ (README.md there
says how each was made): the example GEMM (SIMT: FFMA only), the elementwise example (a 128-bit and
a scalar variant), and one wgmma kernel built for sm_90a (HGMMA) and for plain sm_90 (none)."""

from __future__ import annotations

from pathlib import Path

from cutegen.profile.sass import mix_findings, parse_sass

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
WGMMA_SOURCE = (FIXTURES / "wgmma_probe.cu").read_text()
MATMUL_SOURCE = (Path(__file__).parents[1] / "examples" / "candidates" / "matmul_cute.py").read_text()


def mixes(name: str):
    return parse_sass((FIXTURES / name).read_text())


def test_gemm_example_is_ffma_only_with_cp_async_and_no_tensor_cores():
    (gemm,) = mixes("sass_matmul_cute.txt")
    assert gemm.function == "_ZN11matmul_impl13matmul_kernelEPKfS1_Pfiii"
    assert gemm.ffma == 512  # 8x8 outputs per thread x BLK_K = 8, one k-tile unrolled
    assert gemm.hmma == gemm.hgmma == gemm.other_mma == gemm.tensor_core == 0  # HFMA2.MMA is not an MMA
    assert gemm.cp_async == 15 and gemm.global_loads == 0  # every global load is a cp.async
    assert gemm.shared_loads == 137 and gemm.barriers == 2 and gemm.local_memory == 0
    assert gemm.widest_global_store_bits == 32


def test_vector_widths_of_the_elementwise_example():
    scalar, vector = mixes("sass_swish_scale_cute.txt")
    assert "ILb0E" in scalar.function and "ILb1E" in vector.function  # kAligned = false, true
    assert scalar.widest_global_load_bits == scalar.widest_global_store_bits == 32
    assert vector.widest_global_load_bits == vector.widest_global_store_bits == 128
    assert vector.tensor_core == 0 and vector.ffma > 0


def test_wgmma_is_present_for_sm90a_and_compiled_away_for_sm90():
    (with_a,) = mixes("sass_wgmma_probe_sm90a.txt")
    (plain,) = mixes("sass_wgmma_probe_sm90.txt")
    assert with_a.hgmma == 4 and plain.hgmma == 0  # 64x64x64 tile = 4 HGMMA.64x64x16
    assert mix_findings((with_a,), WGMMA_SOURCE, "gemm", "tf32") == ()
    (finding, ffma_only) = mix_findings((plain,), WGMMA_SOURCE, "gemm", "tf32")
    assert "no HGMMA" in finding and "sm_90a" in finding
    assert "No tensor-core instruction" in ffma_only


def test_findings_for_a_simt_gemm_on_the_fp32_track_point_at_3xtf32():
    findings = mix_findings(mixes("sass_matmul_cute.txt"), MATMUL_SOURCE, "gemm", "fp32")
    assert len(findings) == 1 and "FFMA only: 512 FFMA" in findings[0] and "3xTF32" in findings[0]
    assert mix_findings(mixes("sass_swish_scale_cute.txt"), "", "elementwise", "fp32") == ()


def test_spills_are_reported():
    text = (FIXTURES / "sass_matmul_cute.txt").read_text().replace("LDS R", "LDL R", 3)
    (spilling,) = parse_sass(text)
    assert spilling.local_memory == 3
    assert any("3 local-memory instructions" in f for f in mix_findings((spilling,), "", "elementwise", "fp32"))
