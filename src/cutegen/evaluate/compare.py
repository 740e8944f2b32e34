"""Compare a candidate's outputs with the reference's: the tolerance rule and its error report.

The rule (EVALUATION.md, "Correctness"): an element passes when `|out - ref| <= atol + rtol * |ref|`.
Everything is computed in float64 so that the report itself adds no rounding, in chunks and on the
output's GPU when it has one (`_chunks`), so that a large output needs no host copy of itself; outputs
equal to the reference element for element (`identical`) need none of it: every error is 0. NaN
in both places and equal infinities count as equal (a reference that produces them is matched by
producing them too); any other NaN or infinity in the difference is a mismatch with infinite error.

The reference is itself rounded: where a sum cancels (a GEMM element near zero on heavy-tailed
inputs, or K in the thousands), PyTorch's fp32 result can be farther from the exact value than the
tolerance, and a candidate that sums in another order, or rounds the exact product, would fail an
element it got right. So when the reference's float64 result is known (`ref_delta` = float64 result
minus reference, from `correctness.exact_delta`), an element that fails the rule still passes when
`|out - (ref + delta)| <= atol + rtol * |ref| + |delta|`: no farther from the float64 result than the
reference is, plus the tolerance. Where the reference is accurate (delta ~ 0) this is the rule itself,
so a lower-precision candidate (TF32 where fp32 is asked for) still fails there.

One delta is one draw of the reference's rounding: at an element where the reference was right by
luck, an honest candidate that sums in another order can still fail. Where few elements fail that
rule, the reference process draws its rounding again (`correctness.rounding_slack`) and `ref_slack`
replaces |delta| by a wider envelope of it, still far inside what a lower-precision candidate misses by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from cutegen.records import ErrorStats

if TYPE_CHECKING:
    import torch


def flatten_outputs(outputs: Any) -> list[Any]:
    """The leaves of a forward's result, in order: a tensor gives [tensor], a tuple/list its items."""
    if isinstance(outputs, (tuple, list)):
        return [leaf for item in outputs for leaf in flatten_outputs(item)]
    return [outputs]


# Elements per comparison chunk: each float64 temporary of a chunk takes 128 MiB, so comparing a
# KernelBench output of 1.6G elements needs a few hundred MiB instead of tens of GB of host memory.
# On a GPU the chunks are four times larger (a few GB of temporaries): fewer launches per gigabyte.
CHUNK_ELEMENTS = 1 << 24
CUDA_CHUNK_ELEMENTS = 1 << 26


def _leaf(value: Any) -> torch.Tensor:
    """An output leaf as a detached tensor (complex as real pairs), in its own dtype and device."""
    import torch  # imported here so that importing this module stays cheap (nothing at import time)

    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    tensor = tensor.detach()
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor.resolve_conj())
    return tensor


def _chunks(out: Any, ref: Any, delta: Any,
            slack: Any = None) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, Any, Any]]:
    """(flat offset, out, ref, delta or None, slack or None) in float64 chunks of CHUNK_ELEMENTS, on
    the output's GPU when it is on one (the reference lives on the host; float64 arithmetic is the
    same on both, and the GPU does it without a host copy of the whole output), else on the host.
    `delta` and `slack` are dropped when their shape is not the reference's (slack also without a
    delta)."""
    import torch  # lazy: loading torch takes seconds

    o, r = _leaf(out), _leaf(ref)
    device = o.device if o.device.type == "cuda" else torch.device("cpu")
    d, s = (None if t is None else _leaf(t) for t in (delta, slack))
    d = d if d is not None and d.shape == r.shape else None
    s = s if d is not None and s is not None and s.shape == r.shape else None
    flat = [t.reshape(-1) if t is not None else None for t in (o, r, d, s)]
    size = CUDA_CHUNK_ELEMENTS if device.type == "cuda" else CHUNK_ELEMENTS
    for start in range(0, r.numel(), size):
        o_c, r_c, d_c, s_c = (None if t is None else t[start:start + size].to(device=device, dtype=torch.float64)
                              for t in flat)
        yield start, o_c, r_c, d_c, s_c


def _abs_diff(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|out - ref| with equal values (infinities included) and NaN-vs-NaN at 0, other NaN at inf."""
    import torch  # lazy: loading torch takes seconds

    diff = (out - ref).abs()
    same = (out == ref) | (torch.isnan(out) & torch.isnan(ref))
    diff = torch.where(same, torch.zeros_like(diff), diff)
    return torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)


def _threshold(ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """atol + rtol * |ref|; where the reference is NaN or infinite only an exact match passes."""
    import torch  # lazy: loading torch takes seconds

    return torch.where(torch.isfinite(ref), atol + rtol * ref.abs(), torch.zeros_like(ref))


def _deltas(ref_delta: Any, count: int) -> list[Any]:
    """One tensor (or None) per output leaf of a float64 delta or a slack."""
    leaves = flatten_outputs(ref_delta) if ref_delta is not None else []
    return leaves if len(leaves) == count else [None] * count


def _outside(o: torch.Tensor, r: torch.Tensor, threshold: torch.Tensor, plain: torch.Tensor, d: Any,
             s: Any) -> torch.Tensor:
    """The elements that fail: those outside the plain rule and, with a float64 delta `d`, farther
    from the float64 result than the tolerance plus |d| (or plus the slack `s`, when given)."""
    if d is None:
        return plain
    return plain & (_abs_diff(o, r + d) > threshold + (d.abs() if s is None else s))


def identical(outputs: Any, ref_outputs: Any) -> bool:
    """Whether every output leaf equals the reference's element for element (same structure, shape,
    dtype and device; -0.0 equals 0.0, a NaN anywhere makes it False): then every error is 0 and the
    float64 comparison has nothing to add. Memory-bound kernels often reproduce PyTorch exactly, and
    one read of both tensors replaces some thirty float64 passes over them (1.8 s of each evaluation
    of a 6.4 GB output on an H200)."""
    import torch  # lazy: loading torch takes seconds

    outs, refs = flatten_outputs(outputs), flatten_outputs(ref_outputs)
    return len(outs) == len(refs) and all(
        isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.shape == r.shape and o.dtype == r.dtype
        and o.device == r.device and torch.equal(o, r) for o, r in zip(outs, refs))


def compare_outputs(outputs: Any, ref_outputs: Any, atol: float, rtol: float, ref_delta: Any = None,
                    ref_slack: Any = None) -> ErrorStats:
    """Error statistics of `outputs` against `ref_outputs` (a tensor, or a tuple/list of them).

    max_rel_error is taken over elements whose reference is non-zero (a relative error against 0 is
    undefined); rel_l2_error is ||out - ref||_2 / ||ref||_2 over all elements (0 when both are 0).
    A structure or shape mismatch cannot be compared elementwise: every reference element then counts
    as mismatched and the errors are infinite (check_output_types reports the reason). `ref_delta`
    (float64 result minus reference, same structure, or None) admits elements within the reference's
    own rounding error (see the module docstring); the errors are still reported against `ref_outputs`.
    `ref_slack` (same structure, with `ref_delta`) replaces |delta| in that rule.
    """
    import torch  # lazy: loading torch takes seconds

    outs = [_leaf(o) for o in flatten_outputs(outputs)]  # once: a conjugate view is copied to resolve
    refs = [_leaf(r) for r in flatten_outputs(ref_outputs)]
    total = sum(r.numel() for r in refs)
    shapes_ok = len(outs) == len(refs) and all(o.shape == r.shape for o, r in zip(outs, refs))
    if not shapes_ok:
        return ErrorStats(math.inf, math.inf, math.inf, total, total, atol, rtol)
    if identical(outs, refs):
        return ErrorStats(0.0, 0.0, 0.0, 0, total, atol, rtol)
    # Sums and maxima stay on the comparison's device until the end: one host synchronisation per
    # output leaf, not several per chunk.
    max_abs = max_rel = sq_diff = sq_ref = 0.0
    mismatched = within = 0
    for out, ref, delta, slack in zip(outs, refs, _deltas(ref_delta, len(refs)), _deltas(ref_slack, len(refs))):
        acc = None
        for _, o, r, d, s in _chunks(out, ref, delta, slack):
            diff = _abs_diff(o, r)
            threshold = _threshold(r, atol, rtol)
            plain = diff > threshold
            failing = _outside(o, r, threshold, plain, d, s)
            nonzero = (r != 0) & torch.isfinite(r)
            rel = torch.where(nonzero, diff / torch.where(nonzero, r.abs(), torch.ones_like(r)), torch.zeros_like(r))
            finite_ref = torch.nan_to_num(r, nan=0.0, posinf=0.0, neginf=0.0)
            part = torch.stack([diff.max() if diff.numel() else diff.new_zeros(()),
                                rel.max() if rel.numel() else rel.new_zeros(()),
                                (diff * diff).sum(), (finite_ref * finite_ref).sum(),
                                failing.sum().to(torch.float64), (plain & ~failing).sum().to(torch.float64)])
            acc = part if acc is None else torch.stack([torch.maximum(acc[0], part[0]), torch.maximum(acc[1], part[1]),
                                                        acc[2] + part[2], acc[3] + part[3], acc[4] + part[4],
                                                        acc[5] + part[5]])
        if acc is not None:
            values = acc.tolist()
            max_abs, max_rel = max(max_abs, values[0]), max(max_rel, values[1])
            sq_diff, sq_ref = sq_diff + values[2], sq_ref + values[3]
            mismatched, within = mismatched + int(values[4]), within + int(values[5])
    rel_l2 = math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)
    return ErrorStats(max_abs, max_rel, rel_l2, mismatched, total, atol, rtol, within)


def first_mismatches(
    outputs: Any, ref_outputs: Any, atol: float, rtol: float, limit: int = 5, ref_delta: Any = None,
    ref_slack: Any = None,
) -> tuple[str, ...]:
    """Up to `limit` failing elements as 'output[i] at (r, c): got X, expected Y', for feedback that
    shows a model where its kernel goes wrong (by the same rule as `compare_outputs`)."""
    import torch  # lazy: loading torch takes seconds

    lines: list[str] = []
    refs = flatten_outputs(ref_outputs)
    for k, (out, ref, delta, slack) in enumerate(zip(flatten_outputs(outputs), refs, _deltas(ref_delta, len(refs)),
                                                    _deltas(ref_slack, len(refs)))):
        out, ref = _leaf(out), _leaf(ref)
        shape = tuple(ref.shape)
        if tuple(out.shape) != shape:
            lines.append(f"output[{k}]: shape {tuple(out.shape)}, expected {shape}")
            continue
        for start, o, r, d, s in _chunks(out, ref, delta, slack):
            threshold = _threshold(r, atol, rtol)
            bad = _outside(o, r, threshold, _abs_diff(o, r) > threshold, d, s).nonzero().flatten()
            for flat in bad[: limit - len(lines)].tolist():
                where = tuple(int(i) for i in torch.unravel_index(torch.tensor(start + flat), shape)) if shape else ()
                lines.append(f"output[{k}] at {where}: got {o[flat].item():.6g}, expected {r[flat].item():.6g}")
            if len(lines) >= limit:
                return tuple(lines)
    return tuple(lines[:limit])


# An odd 64-bit constant (2^64 / golden ratio): position weights i * K + 1 differ for every position
# modulo 2^64, so moving or swapping words changes the fingerprint.
_FINGERPRINT_K = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64


def fingerprint(tensor: Any) -> str:
    """An exact fingerprint of a tensor's dtype, shape and bytes: sum over words w_i (int32 words, or
    bytes when the size is not a multiple of 4) of w_i * (i * K + 1), modulo 2^64. Integer
    arithmetic, so it is the same in every process and in any summation order; computed in chunks on
    the tensor's device. Two processes that drew the same inputs (or built the same weights) from
    the same seeds report equal fingerprints without sending the data."""
    import torch  # lazy: loading torch takes seconds

    t = tensor.detach().contiguous().reshape(-1)
    raw = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), CHUNK_ELEMENTS):
        chunk = words[start:start + CHUNK_ELEMENTS].to(torch.int64)
        index = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=t.device)
        total += (chunk * (index * _FINGERPRINT_K + 1)).sum()
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}:{int(total) & (2**64 - 1):016x}"


# ------------------------------------------------------------------ precision against the float64 result

# The precision check of the fp32 track (`compare_precision`, `judge_precision`). Constants measured
# by bench/precision_rule_cpu.py (bench/results/precision-rule-cpu.md): on GEMMs with K from 64 to
# 8192 (uniform [0, 1), randn, heavy-tailed), every honest fp32 order (in k order, split-K, blocked
# as a CPU BLAS sums, tree, exactly rounded) and 3xTF32 stayed within 0.37 of the budget below against
# a reference summed in k order (as cuBLAS's fp32 kernels sum) or blocked; TF32 operands exceeded it
# 1.2 to 90 times up to K = 1024 (uniform) and at every K on randn, bf16 operands 1.5 to 560 times.
UNIT_ROUNDOFF = 2.0 ** -24  # fp32's: half an ulp of 1.0
NORM_FACTOR = 16.0  # the candidate's error may be this many times the reference's own ...
NORM_FLOOR = 2.0 ** -19  # ... plus this much relative L2 error (32 units of roundoff: a fast-math exp's few ulps fit)
# A departure from the reference that holds this share of the error rounding the operands to TF32 (or
# bf16) makes, at this significance (z-score of the correlation), is that rounding: honest fp32 orders
# and 3xTF32 measured shares under 0.05 and |z| < 5, TF32 and bf16 operands a share of 1.0 and z > 30
# on 4096 elements (on heavy-tailed inputs z is lower; the norm rule catches those). TF32 on uniform
# inputs with K >= 4096, whose error is no larger than an fp32 sum's, is caught by this alone.
SIGNATURE_SHARE = 0.25
SIGNATURE_Z = 10.0
# Outputs whose RMS is below 1 are judged elementwise with atol scaled by that RMS (the tolerance the
# output would have at unit size), widened by TINY_FACTOR times the reference's own RMS error; more
# than TINY_MAX_FRACTION of the sampled elements outside it fails.
TINY_FACTOR = 16.0
TINY_MAX_FRACTION = 1e-3


@dataclass(frozen=True)
class PrecisionStats:
    """One output leaf of one trial against the float64 result, at the sampled elements
    (correctness.precision_basis): relative L2 errors of the candidate and of the fp32 reference,
    the budget the rule allows, the operand-rounding signatures and the tiny-output count."""

    leaf: int
    sampled_elements: int
    error_rel_l2: float  # ||out - exact|| / ||exact||
    reference_rel_l2: float  # ||ref - exact|| / ||exact||: the reference's own rounding
    budget_rel_l2: float  # NORM_FACTOR * reference_rel_l2 + NORM_FLOOR
    signature_share: dict[str, float]  # per format: <out - ref, sig> / <sig, sig>
    signature_z: dict[str, float]  # per format: <out - ref, sig> / sqrt(sum (out - ref)^2 sig^2)
    output_rms: float  # RMS of the float64 result
    tiny_atol: float | None  # atol scaled to the output's RMS, where that RMS is below 1
    tiny_failed_elements: int = 0


def compare_precision(outputs: Any, ref_outputs: Any, basis: Any, atol: float, rtol: float) -> list[PrecisionStats]:
    """Measure each output leaf against its float64 basis (a list of correctness.LeafBasis): the
    candidate's and the reference's distance from the float64 result, how much of the error that
    TF32 or bf16 operands make is in the candidate's departure from the reference, and, for an output
    smaller than 1, the elements outside the tolerance scaled to its size. `judge_precision` applies
    the rule.
    Non-finite elements are left to check_nonfinite and compare_outputs."""
    stats = []
    for k, (out, ref, leaf) in enumerate(zip(flatten_outputs(outputs), flatten_outputs(ref_outputs), basis)):
        stats.append(_leaf_precision(k, _leaf(out), _leaf(ref), leaf, atol, rtol))
    return stats


def _at(tensor: torch.Tensor, leaf: Any) -> torch.Tensor:
    """The sampled elements of a leaf, in float64 on the basis's device."""
    import torch  # lazy: loading torch takes seconds

    flat = tensor.reshape(-1)
    if leaf.index is not None:
        flat = flat[leaf.index.to(flat.device)]
    return flat.to(leaf.exact.device, torch.float64)


def _leaf_precision(k: int, out: torch.Tensor, ref: torch.Tensor, leaf: Any, atol: float,
                    rtol: float) -> PrecisionStats:
    import torch  # lazy: loading torch takes seconds

    exact, o, r = leaf.exact, _at(out, leaf), _at(ref, leaf)
    finite = torch.isfinite(exact) & torch.isfinite(o) & torch.isfinite(r)
    count = max(int(finite.sum()), 1)
    err, ref_err = torch.where(finite, o - exact, 0.0), torch.where(finite, r - exact, 0.0)
    scale = float(torch.where(finite, exact, 0.0).norm())
    error, reference = float(err.norm()), float(ref_err.norm())
    # The departure from the reference, not the error: where the reference's own error already
    # follows a format's rounding (a task that rounds its operands on purpose), a candidate that
    # computes as it does is not held to it.
    departure, shares, zs = err - ref_err, {}, {}
    for name, sig in leaf.signatures.items():
        sig = torch.where(finite & torch.isfinite(sig), sig, 0.0)
        along, norm2 = float(departure @ sig), float(sig @ sig)
        spread = math.sqrt(float((departure * departure) @ (sig * sig)))
        shares[name] = along / norm2 if norm2 > 0 else 0.0
        zs[name] = along / spread if spread > 0 else 0.0
    rms = scale / math.sqrt(count)
    tiny_atol, failed = None, 0
    if 0 < rms < 1:
        tiny_atol = atol * rms
        allowed = tiny_atol + rtol * exact.abs() + TINY_FACTOR * reference / math.sqrt(count)
        failed = int((finite & (err.abs() > allowed)).sum())
    relative = (lambda x: x / scale) if scale > 0 else (lambda x: 0.0 if x == 0 else math.inf)
    return PrecisionStats(k, int(exact.numel()), relative(error), relative(reference),
                          NORM_FACTOR * relative(reference) + NORM_FLOOR, shares, zs, rms, tiny_atol, failed)


def judge_precision(stats: Any) -> str | None:
    """Why the candidate fails the fp32 track's precision rule (EVALUATION.md, "Correctness"), or
    None. The exploit: arithmetic below fp32 (TF32 or bf16 operands, a bf16 accumulator), coarse
    approximations (a polynomial exp or erf) and estimates from part of the data (a softmax
    normalised by a sample of its row), whose error hides under atol + rtol * |ref|. The rule, per
    output leaf and trial, against the float64 result:
    - norm: the candidate's relative L2 error is at most NORM_FACTOR times the fp32 reference's own
      plus NORM_FLOOR;
    - signature: its departure from the reference holds less than SIGNATURE_SHARE of the error that
      TF32 or bf16 operands make (or not significantly: z < SIGNATURE_Z). This catches such operands
      where their error is no larger than an fp32 sum's (uniform inputs, K in the thousands), which
      the norm cannot;
    - tiny outputs: where the output's RMS is below 1, at most TINY_MAX_FRACTION of its elements lie
      outside atol * RMS + rtol * |exact| (plus TINY_FACTOR times the reference's RMS error).
    The message names the rule that failed and the measured ratio to the reference's error."""
    for s in (s if isinstance(s, PrecisionStats) else PrecisionStats(**s) for s in stats):
        reasons = _precision_failures(s)
        if reasons:
            ratio = s.error_rel_l2 / s.reference_rel_l2 if s.reference_rel_l2 > 0 else math.inf
            return (f"output[{s.leaf}]'s relative L2 error from the float64 result is {s.error_rel_l2:.3g},"
                    f" {ratio:.3g} times the fp32 reference's own ({s.reference_rel_l2:.3g}). " + " ".join(reasons)
                    + " The fp32 track asks for fp32-accurate results even where atol + rtol * |ref| would accept"
                    " others: no TF32, fp16 or bf16 operands or accumulators (3xTF32 split products are fp32-accurate),"
                    " no approximation of exp, erf or tanh coarser than a few ulps, no estimate from part of the data.")
    return None


_FORMATS = {"tf32": "TF32 (10-bit mantissa, as fp16 has)", "bf16": "bfloat16 (7-bit mantissa)"}


def _precision_failures(s: PrecisionStats) -> list[str]:
    """The parts of the rule that `s` fails, each as a sentence with its numbers."""
    reasons = []
    if s.error_rel_l2 > s.budget_rel_l2:
        reasons.append(f"Norm rule: at most {NORM_FACTOR:g} times the reference's error plus {NORM_FLOOR:.2g}"
                       f" ({s.budget_rel_l2:.3g}).")
    for name, share in s.signature_share.items():
        if share >= SIGNATURE_SHARE and s.signature_z[name] >= SIGNATURE_Z:
            reasons.append(f"Signature rule: its departure from the reference holds {share:.0%} of the error that"
                           f" rounding the operands to {_FORMATS[name]} makes (z = {s.signature_z[name]:.0f}); at most"
                           f" {SIGNATURE_SHARE:.0%} is allowed (or z < {SIGNATURE_Z:g}).")
    if s.tiny_atol is not None and s.tiny_failed_elements > TINY_MAX_FRACTION * s.sampled_elements:
        reasons.append(f"Small-output rule (RMS {s.output_rms:.3g}, below 1): {s.tiny_failed_elements} of"
                       f" {s.sampled_elements} elements are farther from the float64 result than atol scaled to"
                       f" that RMS ({s.tiny_atol:.3g}) + rtol * |exact|; at most {TINY_MAX_FRACTION:g} of them may be.")
    return reasons
