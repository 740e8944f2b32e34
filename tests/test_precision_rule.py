"""The fp32 track's precision rule: a candidate's error against the float64 result, judged against the fp32
reference's own (compare.compare_precision, compare.judge_precision, correctness.precision_basis), in the
reference process and in the verdict.

Every GEMM judged here is summed in a fixed order of elementwise fp32 operations (a fused multiply-add
emulated in float64, which holds each product exactly), reference and candidate alike, so no outcome
depends on this machine's BLAS; the float64 result's own rounding is a billionth of the fp32 errors. The
measurements behind the constants are bench/precision_rule_cpu.py's (bench/results/precision-rule-cpu.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from cutegen.config import EvalConfig
from cutegen.evaluate.compare import (
    NORM_FLOOR,
    PrecisionStats,
    compare_outputs,
    compare_precision,
    judge_precision,
)
from cutegen.evaluate.correctness import LeafBasis, exact_model, precision_basis, round_mantissa
from cutegen.tasks import load_task, task_module

from helpers import header, task_path

REPO = Path(__file__).resolve().parents[1]
CHEATS = REPO / "tests" / "fixtures" / "cheats"
CPU = torch.device("cpu")
F64 = torch.float64


# ------------------------------------------------------------------ GEMMs summed in fixed orders


def fma_sum(a, b, acc_dtype=None):
    """A @ B in k order, one fp32 rounding per step, as fmaf accumulates; `acc_dtype` rounds each sum."""
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k in range(a.shape[1]):
        acc = (acc.to(F64) + a[:, k:k + 1].to(F64) * b[k:k + 1].to(F64)).float()
        acc = acc if acc_dtype is None else acc.to(acc_dtype).float()
    return acc


def split_k(a, b, parts, pairwise=False):
    """K in `parts` slices, each summed from zero, then added in order (a blocked CPU BLAS) or as a tree."""
    step = a.shape[1] // parts
    terms = [fma_sum(a[:, k:k + step], b[k:k + step]) for k in range(0, a.shape[1], step)]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] for i in range(0, len(terms), 2)] if pairwise else [terms[0] + terms[1]] + terms[2:]
    return terms[0]


def three_tf32(a, b):
    """3xTF32: big x small + small x big + big x big, each operand TF32, accumulated in fp32."""
    big_a, big_b = round_mantissa(a, 13), round_mantissa(b, 13)
    small_a, small_b = round_mantissa(a - big_a, 13), round_mantissa(b - big_b, 13)
    return fma_sum(big_a, small_b) + fma_sum(small_a, big_b) + fma_sum(big_a, big_b)


HONEST = {
    "k order": fma_sum,
    "split-K 4": lambda a, b: split_k(a, b, 4),
    "blocks of 256": lambda a, b: split_k(a, b, max(1, a.shape[1] // 256)),
    "tree": lambda a, b: split_k(a, b, a.shape[1], pairwise=True),
    "exactly rounded": lambda a, b: (a.to(F64) @ b.to(F64)).float(),
    "3xTF32": three_tf32,
}
LOWER = {
    "TF32 operands": lambda a, b: fma_sum(round_mantissa(a, 13), round_mantissa(b, 13)),
    "bf16 operands": lambda a, b: fma_sum(round_mantissa(a, 16), round_mantissa(b, 16)),
    "bf16 accumulator": lambda a, b: fma_sum(a, b, torch.bfloat16),
}


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def gemm_inputs(dist: str, k: int, seed: int, size: int = 64):
    """(A, B) of size x k and k x size: uniform [0, 1), or randn (heavy-tailed as the adversarial trial
    makes them: a log-normal factor, 1% of elements x64) drawn in float64 and rounded once."""
    gen = torch.Generator().manual_seed(seed)
    if dist == "uniform":
        return torch.rand(size, k, generator=gen), torch.rand(k, size, generator=gen)
    x = [torch.randn(shape, generator=gen, dtype=F64) for shape in ((size, k), (k, size))]
    if dist == "heavy":
        x = [t * torch.exp(0.5 * torch.randn(t.shape, generator=gen, dtype=F64))
             * torch.where(torch.rand(t.shape, generator=gen, dtype=F64) < 0.01, 64.0, 1.0) for t in x]
    return x[0].float(), x[1].float()


def measure(model, args, ref, out, atol=1e-4, rtol=1e-4) -> PrecisionStats:
    basis, note = precision_basis(exact_model(model), list(args), ref, CPU, seed=7)
    assert note is None, note
    return compare_precision([out], [ref], basis, atol, rtol)[0]


def test_round_mantissa_gives_tf32_and_bfloat16_rounded_to_nearest():
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 1e3
    bits = x.view(torch.int32)
    as_bf16 = round_mantissa(x, 16)
    no_tie = (bits & 0xFFFF) != 0x8000  # ties: bfloat16 rounds to even, round_mantissa away from zero
    assert torch.equal(as_bf16[no_tie], x[no_tie].to(torch.bfloat16).float())
    as_tf32 = round_mantissa(x, 13)
    assert bool(((as_tf32.view(torch.int32) & 0x1FFF) == 0).all())  # 10 explicit mantissa bits left
    down = (bits & ~0x1FFF).view(torch.float32)
    up = ((bits & ~0x1FFF) + 0x2000).view(torch.float32)
    nearest = torch.where((x - down).abs() <= (up - x).abs(), down, up)
    tie = (bits & 0x1FFF) == 0x1000
    assert torch.equal(as_tf32[~tie], nearest[~tie])
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    assert torch.equal(round_mantissa(special, 13)[:2], special[:2]) and bool(round_mantissa(special, 13)[2].isnan())


@pytest.mark.parametrize("dist", ["uniform", "randn", "heavy"])
@pytest.mark.parametrize("k", [64, 1024])
def test_honest_summation_orders_pass_and_lower_precision_fails_against_either_reference_order(dist, k):
    """Against a reference summed in k order (cuBLAS's fp32 kernels) and one summed in blocks of 256 (a
    CPU BLAS), every honest fp32 order and 3xTF32 pass, TF32 or bf16 operands and a bf16 accumulator
    fail, although TF32 stays within atol + rtol * |ref| on uniform inputs with K = 1024 (its relative
    error falls as K grows: at K = 64 it still fails the plain rule at some elements)."""
    a, b = gemm_inputs(dist, k, seed=k)
    for ref_order in ("k order", "blocks of 256"):
        ref = HONEST[ref_order](a, b)
        for name, order in HONEST.items():
            stats = measure(MatMul(), (a, b), ref, order(a, b))
            assert judge_precision([stats]) is None, (ref_order, name, stats)
            assert stats.error_rel_l2 < 0.5 * stats.budget_rel_l2, (ref_order, name, stats)  # with a margin
        for name, order in LOWER.items():
            assert judge_precision([measure(MatMul(), (a, b), ref, order(a, b))]) is not None, (ref_order, name)
    if dist == "uniform" and k == 1024:
        tf32 = LOWER["TF32 operands"](a, b)
        assert compare_outputs(tf32, HONEST["k order"](a, b), 1e-4, 1e-4).mismatched_elements == 0


def test_the_signature_finds_tf32_where_its_error_is_no_larger_than_an_fp32_sum():
    """Uniform inputs, K = 8192: an fp32 sum in k order (what cuBLAS's fp32 kernels do) errs by a third
    of what TF32 operands add, so the norm rule, which must admit a k-order candidate against a blocked
    reference, admits TF32 against a k-order one. The error's share of the TF32 rounding error does
    not depend on sizes: it is 1 for TF32 and 0 for every fp32 order."""
    a, b = gemm_inputs("uniform", 8192, seed=8192, size=48)
    ref = fma_sum(a, b)
    tf32 = measure(MatMul(), (a, b), ref, LOWER["TF32 operands"](a, b))
    assert tf32.error_rel_l2 < tf32.budget_rel_l2  # the norm rule alone would pass it
    assert tf32.signature_share["tf32"] > 0.9 and tf32.signature_z["tf32"] > 20, tf32
    reason = judge_precision([tf32])
    assert reason is not None and "Signature rule" in reason and "Norm rule" not in reason
    blocked = split_k(a, b, 32)
    against_blocked = measure(MatMul(), (a, b), blocked, ref)  # the k-order sum judged against the blocked
    assert judge_precision([against_blocked]) is None, against_blocked
    assert against_blocked.error_rel_l2 > 5 * against_blocked.reference_rel_l2  # far worse, still honest
    assert abs(against_blocked.signature_share["tf32"]) < 0.05


def test_the_small_output_rule_judges_elements_the_norm_rule_lets_through():
    """Outputs far below atol, whose reference is itself inexact (so the norm budget is wide): a
    candidate wrong by half of each of its smallest elements passes the norm rule and atol, and fails
    elementwise against atol scaled to the output's RMS. Outputs of RMS 1 or more are left to the
    plain rule."""
    n = 10_000
    exact = torch.linspace(1e-6, 1e-5, n, dtype=F64)
    noise = torch.randn(n, generator=torch.Generator().manual_seed(1), dtype=F64)
    ref = (exact * (1 + 2e-3 * noise)).float()  # a reference with a 2e-3 relative error: a wide norm budget
    out = exact.clone()
    out[:200] *= 0.5  # 2% of the elements, the smallest, off by half
    basis = [LeafBasis(None, exact, {})]
    stats = compare_precision([out.float()], [ref], basis, 1e-4, 1e-4)[0]
    assert stats.error_rel_l2 <= stats.budget_rel_l2, stats
    assert compare_outputs(out.float(), ref, 1e-4, 1e-4).mismatched_elements == 0
    assert stats.tiny_atol == pytest.approx(1e-4 * float(exact.pow(2).mean().sqrt()))
    assert stats.tiny_failed_elements == 200
    assert "Small-output rule" in judge_precision([stats])
    big = compare_precision([(out * 1e6).float()], [(ref.double() * 1e6).float()], [LeafBasis(None, exact * 1e6, {})],
                            1e-4, 1e-4)[0]
    assert big.tiny_atol is None and big.tiny_failed_elements == 0


def test_the_verdicts_message_names_the_rule_and_the_measured_ratio():
    stats = PrecisionStats(0, 4096, 4e-6, 1e-7, 16 * 1e-7 + NORM_FLOOR, {"tf32": 1.0, "bf16": 0.01},
                           {"tf32": 35.0, "bf16": 0.3}, 64.0, None)
    message = judge_precision([stats.__dict__])  # as the reply carries it
    assert "40 times the fp32 reference's own (1e-07)" in message
    assert "Norm rule: at most 16 times the reference's error plus 1.9e-06 (3.51e-06)" in message
    assert "Signature rule: its departure from the reference holds 100% of the error that rounding the operands to TF32" in message
    assert judge_precision([]) is None


# ------------------------------------------------------------------ the fixtures and their twins


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"precision_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PRECISION_CHEATS = sorted(p for p in CHEATS.glob("7[0-5]_*.py"))


def test_the_precision_fixtures_are_the_compare_precision_cpu_fixtures():
    named = sorted(p for p in CHEATS.glob("[0-9][0-9]_*.py") if header(p)["caught-by"] == "compare_precision"
                   and header(p).get("needs") != "cuda" and header(p).get("layer") != "timing")
    assert named == PRECISION_CHEATS and len(named) == 6


@pytest.mark.parametrize("path", PRECISION_CHEATS, ids=lambda p: p.stem)
def test_each_precision_cheat_hides_under_the_plain_rule_and_fails_the_precision_rule(path):
    """On clean trials the plain rule |out - ref| <= atol + rtol * |ref| passes the cheat everywhere
    (that is the exploit) and the precision rule rejects it; its honest twin passes both, on clean and
    heavy-tailed inputs."""
    from cutegen.evaluate.correctness import ADVERSARIAL_LADDER, adversarial_like

    task = task_module(load_task(task_path(path, REPO)))
    twin_path = REPO / header(path)["twin"]

    def built(module_path: Path | None):
        torch.manual_seed(0)
        init = task.get_init_inputs()
        torch.manual_seed(1)
        return (task.Model if module_path is None else _load(module_path).ModelNew)(*init)

    reference, cheat, twin = built(None), built(path), built(twin_path)
    for seed, adversarial in ((11, False), (12, False), (13, True)):
        torch.manual_seed(seed)
        args = list(task.get_inputs())
        if adversarial:
            args = [adversarial_like(x, seed + i, *ADVERSARIAL_LADDER[0]) for i, x in enumerate(args)]
        with torch.no_grad():
            ref = reference(*args)
            basis, note = precision_basis(exact_model(reference), args, ref, CPU, seed=seed)
            assert note is None
            for candidate, honest in ((twin, True), (cheat, False)):
                if adversarial and not honest:
                    continue  # a cheat may fail the plain rule on heavy tails; the clean trials come first
                out = candidate(*args)
                plain = compare_outputs(out, ref, 1e-4, 1e-4)
                reason = judge_precision(compare_precision([out], [ref], basis, 1e-4, 1e-4))
                assert plain.mismatched_elements == 0, (seed, honest, plain)
                assert (reason is None) == honest, (seed, honest, reason)


# ------------------------------------------------------------------ in the reference process


def _reference_session(monkeypatch, task_file: Path, track: str = "fp32", trials: int = 1):
    from cutegen.evaluate import reference as reference_module
    from cutegen.evaluate.jobs import reference_job

    monkeypatch.setattr(reference_module, "_not_dumpable", lambda: None)  # this is the test's process
    config = EvalConfig(device="cpu", backend="torch", track=track)
    job = reference_job(load_task(task_file), config, trials=trials, adversarial=0, weight_seeds=1, probe=False)
    session = reference_module.ReferenceSession(job)
    session.reference()
    return session


def test_the_reference_process_applies_the_rule_on_the_fp32_track_to_float32_tasks_only(monkeypatch):
    """fp32 track, float32 task: every trial's basis is made with the reference, before any candidate
    runs (a candidate holding the memory cannot deny it). The tf32 track and bf16 tasks keep their
    tolerances: no basis, and the reason says so."""
    session = _reference_session(monkeypatch, REPO / "examples" / "tasks" / "matmul.py", trials=2)
    assert session.precision_rule() is None
    assert sorted(session.bases) == [0, 1] and all(isinstance(b[0], LeafBasis) for b in session.bases.values())
    assert set(session.bases[0][0].signatures) == {"tf32", "bf16"}
    tf32 = _reference_session(monkeypatch, REPO / "examples" / "tasks" / "matmul.py", track="tf32")
    assert "tf32 track keeps its tolerance" in tf32.precision_rule() and tf32.bases == {}
    half = _reference_session(monkeypatch, REPO / "examples" / "tasks" / "matmul_bf16.py")
    assert "bfloat16 tensors keep their dtype's tolerance" in half.precision_rule() and half.bases == {}


def test_a_comparison_reply_carries_the_precision_measurements(monkeypatch, tmp_path):
    """The reply to `compare` holds compare_precision's stats (an output equal to the reference's gets
    [] and no float64 run), and a timed call's comparison (`compare_fresh`) holds them too."""
    from cutegen.evaluate.transfer import export_outputs

    session = _reference_session(monkeypatch, REPO / "tests" / "fixtures" / "tasks" / "matmul_uniform.py")
    ref = session.trials[0].reference
    a, b = session.trials[0].inputs

    def reply(out, name, fresh_seed=None):
        (tmp_path / name).mkdir()
        descriptor, _ = export_outputs([out], tmp_path / name, via="file")
        if fresh_seed is None:
            return session.compare({"trial": 0, "outputs": descriptor})
        return session.compare_fresh({"seed": fresh_seed, "outputs": descriptor})

    assert reply(ref.clone(), "same")["precision"] == []
    tf32 = reply(round_mantissa(a, 13) @ round_mantissa(b, 13), "tf32")
    assert tf32["errors"]["mismatched_elements"] == 0 and tf32["precision"][0]["signature_share"]["tf32"] > 0.9
    assert "Signature rule" in judge_precision(tf32["precision"])
    torch.manual_seed(5)
    fresh_a, fresh_b = task_module(session.task).get_inputs()
    exact = (fresh_a.double() @ fresh_b.double()).float()  # the inputs make_inputs draws from seed 5 on the host
    fresh = reply(exact, "fresh", fresh_seed=5)
    assert fresh["precision"] and judge_precision(fresh["precision"]) is None
    assert sorted(session.bases) == [0]  # the timed call's basis went with its trial


FLOAT64_OOM_ONCE = """
import torch
import torch.nn as nn

FAILED = []


class Model(nn.Module):
    def forward(self, x):
        if x.dtype == torch.float64 and not FAILED:  # the device is full the first time only
            FAILED.append(True)
            raise torch.cuda.OutOfMemoryError("out of memory")
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 512)]


def get_init_inputs():
    return []
"""


def test_a_basis_that_ran_out_of_memory_ahead_is_made_at_the_comparison(monkeypatch, tmp_path):
    """Out of device memory while the reference is made is not kept as the trial's answer: the
    comparison makes the basis again (and a note says why only where it fails there too)."""
    from cutegen.evaluate.transfer import export_outputs

    task_file = tmp_path / "oom_once.py"
    task_file.write_text(FLOAT64_OOM_ONCE)
    session = _reference_session(monkeypatch, task_file)
    assert session.bases == {} and session.basis_notes == {}
    (tmp_path / "out").mkdir()
    x = session.trials[0].inputs[0]
    descriptor, _ = export_outputs([(x.double().softmax(-1)).float()], tmp_path / "out", via="file")
    reply = session.compare({"trial": 0, "outputs": descriptor})
    assert reply["precision"] and reply["precision_note"] is None and judge_precision(reply["precision"]) is None


# ------------------------------------------------------------------ through the pipeline


HONEST_TWINS = ["matmul_uniform_split_k.py", "wide_softmax.py"]


@pytest.mark.parametrize("name", HONEST_TWINS)
def test_the_honest_twins_pass_the_whole_pipeline_with_the_rule_measured(name, tmp_path):
    from cutegen.evaluate.pipeline import evaluate_candidate
    from cutegen.evaluate.service import Evaluator

    path = REPO / "tests" / "fixtures" / "honest" / name
    config = EvalConfig(device="cpu", backend="torch", do_timing=False, cache_dir=tmp_path / "eval",
                        run_timeout_s=300.0, correctness_trials=2, adversarial_trials=1)
    with Evaluator("cpu") as service:
        verdict = evaluate_candidate(path, load_task(task_path(path, REPO)), config, service)
    assert verdict.passed, verdict.feedback
    detail = {c.name: c.detail for c in verdict.checks}["compare_precision"]
    assert detail.startswith("relative L2 error from the float64 result at most"), detail


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("k", [1024, 4096, 8192])
def test_cublas_tf32_fails_and_fp32_orders_pass_on_cuda(k):
    """cuBLAS's own kernels on uniform inputs: the fp32 GEMM (the reference) and a split-K fp32 GEMM
    pass against it, the TF32 tensor-core GEMM fails (by its signature where its error is no larger
    than cuBLAS's fp32 sum). Prints the numbers for the record."""
    gen = torch.Generator(device="cuda").manual_seed(k)
    a = torch.rand(1024, k, device="cuda", generator=gen)
    b = torch.rand(k, 1024, device="cuda", generator=gen)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = a @ b
        split = sum(a[:, i:i + k // 4] @ b[i:i + k // 4] for i in range(0, k, k // 4))
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    basis, note = precision_basis(exact_model(MatMul()), [a, b], ref, torch.device("cuda"), seed=k)
    assert note is None
    for name, out, honest in (("fp32", ref, True), ("split-K fp32", split, True), ("TF32", tf32, False)):
        stats = compare_precision([out], [ref], basis, 1e-4, 1e-4)[0]
        print(f"K={k} {name}: error {stats.error_rel_l2:.3g} reference {stats.reference_rel_l2:.3g}"
              f" budget {stats.budget_rel_l2:.3g} TF32 share {stats.signature_share['tf32']:.3f}"
              f" z {stats.signature_z['tf32']:.0f}")
        assert (judge_precision([stats]) is None) == honest, (name, stats)
