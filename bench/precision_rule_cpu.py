"""The fp32 track's precision rule (cutegen.evaluate.compare.judge_precision), measured on the CPU.

    python3 bench/precision_rule_cpu.py [--out bench/results/precision-rule-cpu.md]

GEMMs (M = N = 64; uniform [0, 1), randn, heavy-tailed; K 64 to 8192) summed in fixed orders of fp32 operations
(fmaf emulated in float64: the same numbers on any CPU and BLAS), judged against a reference summed in k order (as
cuBLAS's fp32 kernels) and one in blocks of 256 (as a CPU BLAS); softmax, layer norm, GELU against PyTorch's fp32.
"""

import argparse
import functools
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

from cutegen.evaluate.compare import UNIT_ROUNDOFF, compare_precision, judge_precision  # noqa: E402
from cutegen.evaluate.correctness import exact_model, precision_basis, round_mantissa  # noqa: E402

F64 = torch.float64


def fma_sum(a, b, acc_dtype=None):  # A @ B in k order, one fp32 rounding per step (fmaf); acc_dtype rounds the sum
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k in range(a.shape[1]):
        acc = (acc.to(F64) + a[:, k:k + 1].to(F64) * b[k:k + 1].to(F64)).float()
        acc = acc if acc_dtype is None else acc.to(acc_dtype).float()
    return acc


def split_k(a, b, parts, pairwise=False):
    """K cut in `parts` slices, each summed in k order from zero; the slices added in order or as a tree."""
    step = a.shape[1] // parts
    terms = [fma_sum(a[:, k:k + step], b[k:k + step]) for k in range(0, a.shape[1], step)]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] for i in range(0, len(terms), 2)] if pairwise else [terms[0] + terms[1]] + terms[2:]
    return terms[0]


def three_tf32(a, b):  # big x small + small x big + big x big, each TF32, accumulated in fp32
    big_a, big_b = round_mantissa(a, 13), round_mantissa(b, 13)
    return fma_sum(big_a, round_mantissa(b - big_b, 13)) + fma_sum(round_mantissa(a - big_a, 13), big_b) + fma_sum(big_a, big_b)


def stochastic_tf32(x, gen=torch.Generator().manual_seed(3)):  # rounded up with the probability of the dropped bits
    return ((x.view(torch.int32) + torch.randint(0, 0x2000, x.shape, generator=gen, dtype=torch.int32)) & ~0x1FFF).view(torch.float32)


HONEST = {"k order": fma_sum, "split-K 4": lambda a, b: split_k(a, b, 4), "split-K 16": lambda a, b: split_k(a, b, 16),
          "blocks of 256": lambda a, b: split_k(a, b, max(1, a.shape[1] // 256)),
          "tree": lambda a, b: split_k(a, b, a.shape[1], pairwise=True),
          "exact": lambda a, b: (a.to(F64) @ b.to(F64)).float(), "3xTF32": three_tf32}
CHEATS = {"TF32": lambda a, b: fma_sum(round_mantissa(a, 13), round_mantissa(b, 13)),
          "bf16": lambda a, b: fma_sum(round_mantissa(a, 16), round_mantissa(b, 16)),
          "bf16 acc": lambda a, b: fma_sum(a, b, torch.bfloat16),
          "SR-TF32": lambda a, b: fma_sum(stochastic_tf32(a), stochastic_tf32(b))}


def task(fn):  # a task's Model computing fn
    return type("Model", (torch.nn.Module,), {"forward": lambda self, *args: fn(*args)})()


def inputs(dist, k, seed):
    gen = torch.Generator().manual_seed(seed)
    if dist == "uniform":
        return torch.rand(64, k, generator=gen), torch.rand(k, 64, generator=gen)
    x = [torch.randn(shape, generator=gen, dtype=F64) for shape in ((64, k), (k, 64))]
    if dist == "heavy":  # as the adversarial trial: a log-normal factor, 1% of elements x64
        x = [t * torch.exp(0.5 * torch.randn(t.shape, generator=gen, dtype=F64))
             * torch.where(torch.rand(t.shape, generator=gen, dtype=F64) < 0.01, 64.0, 1.0) for t in x]
    return x[0].float(), x[1].float()


def judged(model, args, ref, out):
    """(error in units, budget in units, max signature share, verdict letters) of `out` against `ref`."""
    basis, note = precision_basis(exact_model(model), list(args), ref, torch.device("cpu"), seed=1)
    assert note is None, note
    s = compare_precision([out], [ref], basis, 1e-4, 1e-4)[0]
    reasons = judge_precision([s]) or ""
    letters = "".join(c for c, word in (("N", "Norm rule"), ("S", "Signature"), ("T", "Small-output")) if word in reasons)
    return s.error_rel_l2 / UNIT_ROUNDOFF, s.budget_rel_l2 / UNIT_ROUNDOFF, max(s.signature_share.values()), letters


def gemm_rows():
    for dist in ("uniform", "randn", "heavy"):
        for k in (64, 256, 1024, 4096, 8192):
            a, b = inputs(dist, k, seed=k)
            outs = {name: fn(a, b) for name, fn in {**HONEST, **CHEATS}.items()}
            for ref_name in ("k order", "blocks of 256"):
                yield dist, k, ref_name, [judged(task(torch.matmul), (a, b), outs[ref_name], out) for out in outs.values()]


def softmax_by(norm):
    return lambda x: (lambda e: e / norm(e))(torch.exp(x - x.amax(-1, keepdim=True)))


OTHERS = (  # task, shape, reference, candidates
    ("softmax", (8, 65536), lambda x: torch.softmax(x, -1), {
        "k-order sum": softmax_by(lambda e: functools.reduce(torch.add, e.unbind(-1)).unsqueeze(-1)),
        "sum of every 16th x16": softmax_by(lambda e: 16 * e[:, ::16].sum(-1, keepdim=True)),
        "bf16 row sums": softmax_by(lambda e: e.sum(-1, keepdim=True).bfloat16().float())}),
    ("layer norm", (64, 4096), lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), {
        "one-pass E[x^2]-E[x]^2": lambda x: (x - x.mean(-1, keepdim=True)) * torch.rsqrt(
            (x * x).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2 + 1e-5)}),
    ("gelu", (256, 4096), torch.nn.functional.gelu, {
        "0.5x(1+erf(x/sqrt2))": lambda x: 0.5 * x * (1 + torch.erf(x * 0.7071067811865476)),
        "tanh approximation": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}))


def other_rows():
    gen = torch.Generator().manual_seed(0)
    for name, shape, fn, variants in OTHERS:
        for dist in ("uniform", "randn"):
            x = torch.rand(shape, generator=gen) if dist == "uniform" else torch.randn(shape, generator=gen)
            ref = fn(x)
            for variant, candidate in variants.items():
                plain = int(((candidate(x) - ref).abs() > 1e-4 + 1e-4 * ref.abs()).sum())  # the plain rule's failures
                yield name, dist, variant, plain, judged(task(fn), (x,), ref, candidate(x))


def report() -> str:
    names = list({**HONEST, **CHEATS})
    lines = ["# The precision rule on the CPU (bench/precision_rule_cpu.py)", "", "Each cell: error from the float64"
             " result / budget (16 x the reference's error + 2^-19) in units of 2^-24 ||exact||, then the rule that failed"
             f" (N norm, S TF32/bf16 signature, T small outputs). Honest: {', '.join(HONEST)}; cheats: {', '.join(CHEATS)}.", "",
             "| inputs | K | reference | " + " | ".join(names) + " |", "|" + " --- |" * (3 + len(names))]
    for dist, k, ref_name, cells in gemm_rows():
        lines.append(f"| {dist} | {k} | {ref_name} | " + " | ".join(
            f"{e:.3g}/{b:.3g} {v or 'pass'}" + (f" s={s:.2f}" if s > 0.05 else "") for e, b, s, v in cells) + " |")
    lines += ["", "| task | inputs | candidate | plain-rule failures | error | budget | TF32/bf16 share | verdict |",
              "|" + " --- |" * 8]
    for name, dist, variant, plain, (e, b, s, v) in other_rows():
        lines.append(f"| {name} | {dist} | {variant} | {plain} | {e:.3g} | {b:.3g} | {s:.2g} | {v or 'pass'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "precision-rule-cpu.md")
    out, _ = parser.parse_args().out, torch.set_num_threads(1)
    out.write_text(text := report())
    print(text)


if __name__ == "__main__":
    main()
