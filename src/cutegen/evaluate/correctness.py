"""Correctness: the candidate's outputs against the reference's, over unpredictable trials.

The protocol is stated once, in EVALUATION.md ("Correctness"). The worker-side functions here draw
inputs, build models and run the reference (`make_inputs`, `build_model`, `reference_trial`,
`exact_delta`, `rounding_slack`) for the processes that measure (reference.ReferenceSession,
runner.CandidateSession); the parent turns their measurements into checks (`judge_weights`,
`judge_trials`, `judge_determinism`, `judge_precision_entry`).
"""

from __future__ import annotations

import copy
import math
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from cutegen.config import HALF_DTYPES
from cutegen.evaluate.compare import CHUNK_ELEMENTS, PrecisionStats, flatten_outputs, judge_precision
from cutegen.records import CheckResult, ErrorStats, Finding

OUTLIER_FRACTION = 0.01
# Adversarial strengths, strongest first: outlier scale for signed data, power for data in [0, 1].
# A milder one is tried when the reference itself overflows on the stronger one.
ADVERSARIAL_LADDER = ((64.0, 4.0), (8.0, 2.0))
DETERMINISM_FACTOR = 0.1  # the determinism run must agree within a tenth of the track tolerance


def unpredictable_seed() -> int:
    """A 63-bit seed from os.urandom, drawn in the parent: nothing in the worker can predict it."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def trial_plan(correctness_trials: int, adversarial_trials: int, weight_seeds: int) -> list[dict]:
    """Which inputs seed, weight seed and distribution each trial uses (all seeds fresh)."""
    plan = []
    for i in range(correctness_trials + adversarial_trials):
        plan.append({"seed": unpredictable_seed(), "weight": i % weight_seeds,
                     "adversarial": i >= correctness_trials})
    return plan


# ------------------------------------------------------------------------------------- in the worker


def to_device(value: Any, device: Any, copy_: bool = True) -> Any:
    """A fresh copy of a tensor (or nested list/tuple of them) on `device`; other values as they are.
    `copy_=False` moves without copying what is already there."""
    import torch  # lazy: loading torch takes seconds

    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=copy_)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device, copy_) for v in value)
    return copy.deepcopy(value)


def tensors_of(value: Any) -> list[Any]:
    import torch  # lazy: loading torch takes seconds

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def adversarial_like(x: Any, seed: int, outlier_scale: float, power: float) -> Any:
    """Heavy-tailed version of a float tensor (integer and bool tensors are left as the task made them).

    Data inside [0, 1] (probabilities, masks) is raised to `power`, which piles mass near 0 and keeps
    the range; other data is multiplied by a log-normal factor and 1% of its elements by
    `outlier_scale`, keeping signs. Either way a kernel that assumes unit-scale inputs (a fixed max
    in a softmax, a too-small accumulator, an unsafe exp) is exposed.
    """
    import torch  # lazy: loading torch takes seconds

    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        return x
    # Drawn where x lives: the host's generator is serial, slow for KernelBench's 8 GB inputs.
    gen = torch.Generator(device=x.device).manual_seed(seed)
    data = x.detach().to(torch.float32)
    if float(data.min()) >= 0.0 and float(data.max()) <= 1.0:
        return data.pow(power).to(x.dtype)
    tails = torch.exp(0.5 * torch.randn(data.shape, generator=gen, device=x.device))
    outliers = torch.rand(data.shape, generator=gen, device=x.device) < OUTLIER_FRACTION
    scaled = data * tails * torch.where(outliers, outlier_scale, 1.0)
    return scaled.to(x.dtype)


def make_inputs(module: Any, seed: int, adversarial: tuple[float, float] | None, device: Any = None,
                home: Any = "cpu") -> list[Any]:
    """The task's inputs for `seed`, optionally made heavy-tailed, as copies kept on `home` (the host
    when a candidate will run: there it cannot reach them).

    With a CUDA `device`, get_inputs() runs with it as the default device, so the task's random
    tensors come from the device's generator, in milliseconds: the host's is serial, which makes
    KernelBench's largest inputs (8 GB of torch.rand) slow to draw. The values differ from a host
    draw of the same seed; every side of an evaluation gets copies of the same draw. A task
    whose get_inputs() cannot run so (numpy on a tensor) is drawn on the host, by every side alike.
    Running out of device memory is not such a task: a host draw there would give other values than
    the other processes' device draws (and the evaluation would blame the task), so the draw is
    tried once more after freeing cached memory, and the error is raised if it fails again.
    """
    import torch  # lazy: loading torch takes seconds

    inputs = None
    if device is not None and torch.device(device).type == "cuda":
        for attempt in range(2):
            try:
                _seed_all(seed)  # seeds the host's and every device's generator
                with torch.device(device):
                    inputs = list(module.get_inputs())
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                if attempt == 1:
                    raise
            except Exception:  # noqa: BLE001 - the host draw below raises the task's own error, if any
                torch.cuda.empty_cache()
                break
    if inputs is None:
        _seed_all(seed)
        inputs = list(module.get_inputs())
    if adversarial is not None:
        inputs = [adversarial_like(x, seed + k, *adversarial) for k, x in enumerate(inputs)]
    return to_device(inputs, home, copy_=False)  # freshly drawn: nothing else holds them


def _seed_all(seed: int) -> None:
    """Seed torch (host and devices) and, where a task draws from them, Python's and NumPy's
    generators: the reference's process and the candidate's draw the same inputs from one seed."""

    import torch  # lazy: loading torch takes seconds

    torch.manual_seed(seed)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


def build_model(cls: type, init_inputs: Sequence[Any], seed: int, device: Any) -> Any:
    """Construct `cls(*init_inputs)` right after `torch.manual_seed(seed)`, then move it: Model and
    ModelNew built this way draw the same random numbers in the same order for the same layers."""
    import torch  # lazy: loading torch takes seconds

    torch.manual_seed(seed)
    return cls(*copy.deepcopy(list(init_inputs))).to(device)


def lowest_precision(tensors: Sequence[Any]) -> str:
    """The float dtype with the loosest tolerance among `tensors` ("float32" when none is half)."""
    names = {str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()}
    return next((n for n in HALF_DTYPES if n in names), "float32")


@dataclass
class Trial:
    """One correctness trial as the worker keeps it: pristine host inputs and the reference output."""

    seed: int
    weight: int
    adversarial: bool
    inputs: list[Any]
    reference: Any = None
    ref_mutates: list[int] = field(default_factory=list)
    note: str | None = None  # why an adversarial trial was made milder or skipped
    exact_delta: Any = None  # float64 result minus the reference (`exact_delta`), or None
    strength: tuple[float, float] | None = None  # the adversarial strength its inputs were drawn with


def run_reference(model: Any, trial_inputs: list[Any], device: Any, home: Any = "cpu") -> tuple[Any, list[int]]:
    """The reference output (a copy on `home`, as the inputs) for one set of inputs, and which inputs
    it mutated."""
    import torch  # lazy: loading torch takes seconds

    from cutegen.evaluate.checks_dynamic import inputs_mutated  # lazy: checks_dynamic loads torch

    args = to_device(trial_inputs, device)
    with torch.no_grad():
        out = model(*args)
    return to_device(out, home, copy_=False), inputs_mutated(trial_inputs, args)


def all_finite(value: Any) -> bool:
    import torch  # lazy: loading torch takes seconds

    return all(bool(torch.isfinite(t).all()) for t in tensors_of(value) if t.is_floating_point())


# The float64 run must agree with the reference this closely (relative L2) to be trusted as its exact
# value: a task that draws random numbers in forward, or whose meaning changes with the dtype, fails it.
EXACT_AGREEMENT = 1e-2


def _float64_gaps(ref: Any, exact: Any) -> Iterator[tuple[slice, Any, Any]]:
    """(flat slice, the reference's chunk, float64 result minus reference) in float64 chunks of
    CHUNK_ELEMENTS on the float64 result's device; 0 where either is not finite."""
    import torch  # lazy: loading torch takes seconds

    flat_r, flat_e = ref.detach().reshape(-1), exact.detach().reshape(-1)
    for start in range(0, flat_r.numel(), CHUNK_ELEMENTS):
        part = slice(start, start + CHUNK_ELEMENTS)
        r, e = flat_r[part].to(exact.device, torch.float64), flat_e[part].double()
        yield part, r, torch.where(torch.isfinite(r) & torch.isfinite(e), e - r, torch.zeros_like(r))


def exact_model(model: Any) -> Any | None:
    """A float64 copy of the reference model (None when it cannot be made): the same weights, so the
    same function evaluated with far less rounding."""
    try:
        return copy.deepcopy(model).double()
    except Exception:  # noqa: BLE001 - a module that cannot be copied or cast just gets no float64 run
        return None


def exact_delta(model64: Any, trial_inputs: list[Any], reference: Any, device: Any) -> tuple[Any, str | None]:
    """(float64 result minus the reference per output leaf, or None; why not, or None).

    The inputs' floating tensors are cast to float64 for a run of `model64` (from `exact_model`) on
    `device`, where the difference stays (computed in chunks: no host copy, no float64 copy of the
    reference). The difference is kept in float32 (float64 for a float64 reference): it only widens
    the tolerance where the reference is itself inaccurate (compare.compare_outputs). It is dropped
    when any leaf is not a floating tensor of the reference's shape, or when the float64 result
    differs from the reference by more than EXACT_AGREEMENT (relative L2), which rounding alone
    never does.
    """
    import torch  # lazy: loading torch takes seconds

    if model64 is None or reference is None:
        return None, "no float64 copy of the reference model"
    args = [t.detach().to(device, torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point()
            else to_device(t, device) for t in trial_inputs]
    try:
        with torch.no_grad():
            exact = model64(*args)
    except Exception as err:  # noqa: BLE001 - an op without float64 support: the plain rule applies
        return None, f"float64 reference failed: {type(err).__name__}"
    del args
    refs, exacts = flatten_outputs(reference), flatten_outputs(exact)
    if len(refs) != len(exacts):
        return None, "the float64 result does not match the reference's structure"
    deltas = []
    for ref, ex in zip(refs, exacts):
        if not (isinstance(ref, torch.Tensor) and isinstance(ex, torch.Tensor) and ref.is_floating_point()
                and ex.is_floating_point() and ex.shape == ref.shape):
            return None, "the float64 result does not match the reference's structure"
        delta = torch.empty(ref.shape, dtype=torch.float64 if ref.dtype == torch.float64 else torch.float32,
                            device=ex.device)
        flat_d = delta.view(-1)
        sq_delta = sq_scale = 0.0
        for part, r, d in _float64_gaps(ref, ex):
            flat_d[part] = d
            sq_delta += float((d * d).sum())
            finite = torch.nan_to_num(r, nan=0.0, posinf=0.0, neginf=0.0)
            sq_scale += float((finite * finite).sum())
        if math.sqrt(sq_delta) > EXACT_AGREEMENT * math.sqrt(sq_scale):
            return None, "the float64 result disagrees with the reference (random or dtype-specific forward)"
        deltas.append(delta)
    return (deltas[0] if isinstance(reference, torch.Tensor) else deltas), None


# ------------------------------------------------------- the float64 basis of the precision check

# Operand formats whose rounding the precision check looks for in a candidate's error, as the number
# of low fp32 mantissa bits each clears: TF32 (10-bit mantissa, which fp16 shares) and bfloat16 (7).
SIGNATURE_FORMATS = {"tf32": 13, "bf16": 16}
# Elements of an output leaf the precision check compares (a sample drawn where the candidate cannot
# see it; every element of a smaller leaf): norms and correlations over a million elements are as
# good as over all of them, and a trial's basis stays a few tens of MB for outputs of any size.
PRECISION_SAMPLE = 1 << 20


def round_mantissa(x: Any, dropped_bits: int) -> Any:
    """float32 `x` rounded to nearest (ties away from zero) with its `dropped_bits` low mantissa bits
    cleared: 13 gives TF32 (what cvt.rna.tf32 or a TF32 tensor core fed rounded operands computes
    with), 16 gives bfloat16's mantissa. Infinities and NaN are kept."""
    import torch  # lazy: loading torch takes seconds

    bits = x.detach().contiguous().view(torch.int32)
    rounded = ((bits + (1 << (dropped_bits - 1))) & ~((1 << dropped_bits) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)


@dataclass
class LeafBasis:
    """What the precision check needs of one output leaf, at its sampled elements."""

    index: Any  # flat indices of the sampled elements (int64, on the exact result's device), or None: all
    exact: Any  # the float64 result there
    signatures: dict[str, Any]  # per SIGNATURE_FORMATS name: the float64 result on operands rounded to
    # that format, minus `exact`, there: the error a candidate computing with such operands makes


def _rounded_copy(model64: Any, dropped_bits: int) -> Any:
    """A copy of the float64 model whose floating parameters are rounded as `round_mantissa` rounds
    (they hold float32 values: the reference's weights, cast)."""
    import torch  # lazy: loading torch takes seconds

    rounded = copy.deepcopy(model64)
    with torch.no_grad():
        for param in rounded.parameters():
            if param.is_floating_point():
                param.copy_(round_mantissa(param.float(), dropped_bits).double())
    return rounded


def _float64_leaves(model64: Any, trial_inputs: list[Any], device: Any, dropped_bits: int | None = None) -> list[Any]:
    """The leaves of `model64`'s result on the trial's inputs in float64 (rounded first as
    `round_mantissa` rounds, with `dropped_bits`), with its parameters rounded alike."""
    import torch  # lazy: loading torch takes seconds

    def operand(t: Any) -> Any:
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            return to_device(t, device)
        t = t.detach().to(device)
        return (t if dropped_bits is None else round_mantissa(t.float(), dropped_bits)).double()

    model = model64 if dropped_bits is None else _rounded_copy(model64, dropped_bits)
    with torch.no_grad():
        return flatten_outputs(model(*[operand(t) for t in trial_inputs]))


def _sampled(ref: Any, exact: Any, seed: int) -> LeafBasis | None:
    """The float64 result of one leaf at up to PRECISION_SAMPLE elements drawn from `seed` (all of a
    smaller leaf), or None where it differs from the reference beyond EXACT_AGREEMENT there."""
    import torch  # lazy: loading torch takes seconds

    index = None
    if exact.numel() > PRECISION_SAMPLE:
        gen = torch.Generator(device=exact.device).manual_seed(seed)
        index = torch.randint(exact.numel(), (PRECISION_SAMPLE,), generator=gen, device=exact.device).sort().values
    sample = exact.reshape(-1) if index is None else exact.reshape(-1)[index]
    rounded = ref.detach().reshape(-1) if index is None else ref.detach().reshape(-1)[index.to(ref.device)]
    rounded = rounded.to(sample.device, torch.float64)
    finite = torch.isfinite(sample) & torch.isfinite(rounded)
    if float(torch.where(finite, sample - rounded, 0.0).norm()) > EXACT_AGREEMENT * float(
            torch.where(finite, sample, 0.0).norm()):
        return None
    return LeafBasis(index, sample.clone(), {})


def precision_basis(model64: Any, trial_inputs: list[Any], reference: Any, device: Any,
                    seed: int) -> tuple[list[LeafBasis] | None, str | None]:
    """(per output leaf, the float64 result and the operand-rounding signatures at up to
    PRECISION_SAMPLE elements drawn from `seed`, or None; why not, or None). Made once per trial by
    the reference process; `compare.compare_precision` judges a candidate's outputs with it. As for
    `exact_delta`, no basis when a leaf is not a floating tensor of the reference's shape, when the
    float64 result disagrees with the reference beyond EXACT_AGREEMENT (random or dtype-specific
    forward), or when an op has no float64 version."""
    import torch  # lazy: loading torch takes seconds

    if model64 is None or reference is None:
        return None, "no float64 copy of the reference model"
    refs = flatten_outputs(reference)
    try:
        exacts = _float64_leaves(model64, trial_inputs, device)
    except torch.cuda.OutOfMemoryError:
        raise  # the reference process decides whether to try again later
    except Exception as err:  # noqa: BLE001 - an op without float64 support: the plain rule applies
        return None, f"float64 reference failed: {type(err).__name__}"
    if len(exacts) != len(refs) or not all(
            isinstance(r, torch.Tensor) and isinstance(e, torch.Tensor) and r.is_floating_point()
            and e.is_floating_point() and e.shape == r.shape for r, e in zip(refs, exacts)):
        return None, "the float64 result does not match the reference's structure"
    bases = [_sampled(ref, exact, seed + k) for k, (ref, exact) in enumerate(zip(refs, exacts))]
    if any(basis is None for basis in bases):
        return None, "the float64 result disagrees with the reference (random or dtype-specific forward)"
    del exacts
    for name, bits in SIGNATURE_FORMATS.items():
        try:
            leaves = _float64_leaves(model64, trial_inputs, device, bits)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception:  # noqa: BLE001 - a forward that refuses rounded operands: no signature of them
            continue
        for basis, leaf, ref in zip(bases, leaves, refs):
            if isinstance(leaf, torch.Tensor) and leaf.shape == ref.shape:
                flat = leaf.reshape(-1) if basis.index is None else leaf.reshape(-1)[basis.index]
                basis.signatures[name] = flat.to(basis.exact.device, torch.float64) - basis.exact
        del leaves
    return bases, None


# The reference's rounding drawn again (`rounding_slack`). One float64 delta is one sample of the
# reference's rounding error at each element; a candidate that sums in another order makes errors of
# the same size at other elements, and where a sum cancels (a GEMM element near 0 on heavy-tailed
# inputs) the reference can be right by luck where an honest candidate is not. On the example
# GEMM's shapes with heavy-tailed inputs (the adversarial trial), a k-by-k fp32 sum was rejected by
# the single delta in 6 of 12 draws and needed at most 2.9 times the envelope of three redraws
# (tests/test_evaluate_units.py); TF32 operands stayed 8e4 times or more outside it in a simulation
# of the same shapes, and a 3xTF32 kernel on an H200 failed one element of 196608 by the single delta.
ENVELOPE_DRAWS = 3
ENVELOPE_FACTOR = 16.0  # TF32 is 2^13 times coarser than fp32, bf16 2^16: both stay far outside
ENVELOPE_MAX_FRACTION = 1e-3  # more failing elements than this is not rounding: no redraws


def rounding_slack(model: Any, model64: Any, trial_inputs: list[Any], reference: Any, delta: Any,
                   device: Any, seed: int) -> tuple[Any, str | None]:
    """(per output leaf, the distance from the float64 result an element may keep beyond the
    tolerance, or None; why not, or None): max(|delta|, ENVELOPE_FACTOR x the largest |float64 result
    - reference| over ENVELOPE_DRAWS redraws). Each redraw moves the trial's floating inputs by at
    most one unit in their last place (random, from `seed`), which leaves the function as it was and
    draws its rounding anew, and runs `model` (the reference, at its precision) and `model64` on
    them. An element outside `|out - (ref + delta)| <= tol + slack` is farther from the exact result
    than the reference's own rounding reaches, by a margin no fp32-accurate candidate needs.
    """
    import torch  # lazy: loading torch takes seconds

    if model is None or model64 is None or delta is None:
        return None, "no float64 result"
    leaves, deltas = flatten_outputs(reference), flatten_outputs(delta)
    envelope = [torch.zeros_like(d) for d in deltas]
    for draw in range(ENVELOPE_DRAWS):
        gen = None
        moved = []
        for x in trial_inputs:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                x = x.detach().to(device)
                if gen is None or gen.device != x.device:
                    gen = torch.Generator(device=x.device).manual_seed(seed + draw)
                step = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2).sub_(1)
                moved.append(x + x * step.mul_(torch.finfo(x.dtype).eps))
            else:
                moved.append(to_device(x, device))
        try:
            with torch.no_grad():
                rounded = flatten_outputs(model(*moved))
                exact = flatten_outputs(model64(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point()
                                                  else t for t in moved]))
        except Exception as err:  # noqa: BLE001 - out of memory, or a forward that refuses the redraw
            return None, f"the redrawn reference failed: {type(err).__name__}"
        del moved
        if len(rounded) != len(leaves) or len(exact) != len(leaves) or any(
                not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != e.shape
                or b.shape != e.shape for a, b, e in zip(rounded, exact, envelope)):
            return None, "the redrawn reference does not match the reference's structure"
        for a, b, env in zip(rounded, exact, envelope):
            flat_env = env.view(-1)
            for part, _, gap in _float64_gaps(a, b):
                torch.maximum(flat_env[part], gap.abs().to(env.dtype), out=flat_env[part])
        del rounded, exact
    slack = [torch.maximum(d.abs(), env.mul_(ENVELOPE_FACTOR)) for d, env in zip(deltas, envelope)]
    return (slack[0] if isinstance(reference, torch.Tensor) else slack), None


def reference_trial(module: Any, model: Any, spec: dict, device: Any, clean_finite: bool,
                    home: Any = "cpu") -> Trial:
    """One trial's inputs and reference output, kept on `home`; an adversarial trial whose reference
    overflows where clean inputs do not is retried milder, then skipped (the task's domain forbids
    such inputs)."""
    if not spec["adversarial"]:
        inputs = make_inputs(module, spec["seed"], None, device, home)
        out, mutates = run_reference(model, inputs, device, home)
        return Trial(spec["seed"], spec["weight"], False, inputs, out, mutates)
    for strength in ADVERSARIAL_LADDER:
        inputs = make_inputs(module, spec["seed"], strength, device, home)
        out, mutates = run_reference(model, inputs, device, home)
        if all_finite(out) or not clean_finite:
            note = None if strength == ADVERSARIAL_LADDER[0] else f"milder outliers (x{strength[0]:g})"
            return Trial(spec["seed"], spec["weight"], True, inputs, out, mutates, note, strength=strength)
    return Trial(spec["seed"], spec["weight"], True, [], None, [],
                 "skipped: the reference is not finite on heavy-tailed inputs")


def bitwise_equal(first: Any, second: Any) -> bool:
    """Whether two forwards' tensors are the same, element for element, NaN where NaN (the
    determinism check's "bitwise"); the plain comparison first, as most outputs hold no NaN."""
    import torch  # lazy: loading torch takes seconds

    pairs = list(zip(tensors_of(first), tensors_of(second)))
    return len(pairs) == len(tensors_of(first)) == len(tensors_of(second)) and all(
        a.shape == b.shape and a.dtype == b.dtype
        and (torch.equal(a, b) or torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))
        for a, b in pairs)


# ------------------------------------------------------------------------------------- in the parent


def aggregate_errors(stats: Sequence[ErrorStats]) -> ErrorStats | None:
    """Worst case over trials (max of maxima; mismatches and elements summed)."""
    if not stats:
        return None
    return ErrorStats(
        max_abs_error=max(s.max_abs_error for s in stats),
        max_rel_error=max(s.max_rel_error for s in stats),
        rel_l2_error=max(s.rel_l2_error for s in stats),
        mismatched_elements=sum(s.mismatched_elements for s in stats),
        total_elements=sum(s.total_elements for s in stats),
        atol=stats[0].atol,
        rtol=stats[0].rtol,
        within_reference_error=sum(s.within_reference_error for s in stats),
    )


def error_stats(data: Any) -> ErrorStats:
    return ErrorStats(**{k: (int(v) if k in ErrorStats.COUNTS else float(v)) for k, v in data.items()})


def _describe_trial(entry: dict[str, Any], count: int) -> str:
    kind = "heavy-tailed inputs" if entry["adversarial"] else "normal inputs"
    return f"trial {entry['index'] + 1} of {count}, {kind}"


def mismatch_feedback(entry: dict[str, Any], stats: ErrorStats, count: int) -> str:
    lines = [
        f"Wrong output ({_describe_trial(entry, count)}): {stats.mismatched_elements} of"
        f" {stats.total_elements} elements outside |out - ref| <= {stats.atol:g} + {stats.rtol:g} * |ref|"
        f" (max abs error {stats.max_abs_error:.3g}, max rel error {stats.max_rel_error:.3g},"
        f" relative L2 error {stats.rel_l2_error:.3g}).",
    ]
    if entry.get("first_mismatches"):
        lines.append("First mismatches: " + "; ".join(entry["first_mismatches"]) + ".")
    return "\n".join(lines)


def judge_weights(weights: Sequence[dict[str, Any]]) -> CheckResult:
    differ = sorted({name for w in weights for name in w["differ"]})
    compared = max((w["compared"] for w in weights), default=0)
    if differ:
        return CheckResult(
            "weights_match", "correctness", False,
            f"ModelNew's parameters/buffers {', '.join(differ[:5])} differ from Model's after both were"
            " built with the same seed and init inputs: create them in the same order and with the same"
            " initialisation as Model (e.g. keep Model's nn.Linear/nn.Conv layers and read their"
            " .weight/.bias in forward).")
    detail = f"{compared} same-named parameters/buffers equal" if compared else "no parameters to compare"
    return CheckResult("weights_match", "correctness", True, detail)


def judge_trials(trials: Sequence[dict[str, Any]]) -> tuple[list[CheckResult], str | None, str | None]:
    """Checks for the trials, the first failed check's name and its feedback (None when all pass)."""

    count = len(trials)
    for entry in trials:
        if entry.get("skipped"):
            continue
        where = _describe_trial(entry, count)
        for finding in entry["findings"]:
            message = f"{finding['message']} ({where})"
            check = CheckResult(finding["check"], "correctness", False, message, (Finding(**finding),))
            return [check], finding["check"], message
        if entry["mutated"]:
            message = (f"The candidate changed input(s) {entry['mutated']} in place ({where}); the"
                       " reference leaves them unchanged. Write results only to new output tensors.")
            return [CheckResult("inputs_mutated", "correctness", False, message)], "inputs_mutated", message
        stats = error_stats(entry["errors"]) if isinstance(entry["errors"], dict) else entry["errors"]
        if stats.mismatched_elements or not math.isfinite(stats.max_abs_error):
            message = mismatch_feedback(entry, stats, count)
            return [CheckResult("compare_outputs", "correctness", False, message)], "compare_outputs", message
        check = judge_precision_entry(entry.get("precision"), where)
        if not check.passed:
            return [check], check.name, check.detail
    run = [e for e in trials if not e.get("skipped")]
    checks = [CheckResult("compare_outputs", "correctness", True, f"{len(run)} trials within tolerance"),
              precision_summary(run)]
    checks += [CheckResult("adversarial_inputs", "correctness", True, str(e.get("skipped") or e.get("note")))
               for e in trials if e["adversarial"] and (e.get("skipped") or e.get("note"))]
    return checks, None, None


def judge_precision_entry(precision: Any, where: str) -> CheckResult:
    """The precision rule (compare.judge_precision) on one compared output: a trial's or a verified
    timed call's (`where` says which); passed when it was not measured."""

    reason = judge_precision(precision or [])
    if reason is None:
        return CheckResult("compare_precision", "correctness", True, "")
    return CheckResult("compare_precision", "correctness", False,
                       f"Not fp32-accurate ({where}): {reason}")


def precision_summary(entries: Sequence[dict[str, Any]]) -> CheckResult:
    """The passed precision check's detail over the trials: the worst error as a share of what the
    rule allows, the largest TF32/bf16 signature share, or why the rule did not apply."""

    judged = [PrecisionStats(**s) if isinstance(s, dict) else s for e in entries for s in (e.get("precision") or [])]
    equal = sum(1 for e in entries if e.get("precision") == [])
    notes = sorted({e["precision_note"] for e in entries if e.get("precision") is None and e.get("precision_note")})
    if not judged:
        detail = (f"not applied: {'; '.join(notes)}" if notes else
                  f"outputs equal to the reference's in {equal} trials" if equal else "not measured")
        return CheckResult("compare_precision", "correctness", True, detail)
    worst = max(judged, key=lambda s: s.error_rel_l2 / s.budget_rel_l2)
    share = max((v for s in judged for v in s.signature_share.values()), default=0.0)
    detail = (f"relative L2 error from the float64 result at most {worst.error_rel_l2:.3g} (the fp32 reference's"
              f" {worst.reference_rel_l2:.3g}; allowed {worst.budget_rel_l2:.3g}), largest TF32/bf16 rounding"
              f" share {share:.2g}, over {len(judged)} outputs"
              + (f"; {equal} trials equal to the reference" if equal else "")
              + (f"; not applied: {'; '.join(notes)}" if notes else ""))
    return CheckResult("compare_precision", "correctness", True, detail)


def judge_determinism(data: dict[str, Any]) -> CheckResult:
    stats = error_stats(data["errors"]) if isinstance(data["errors"], dict) else data["errors"]
    if stats.mismatched_elements or not math.isfinite(stats.max_abs_error):
        return CheckResult(
            "determinism", "correctness", False,
            f"Two runs on identical inputs disagree in {stats.mismatched_elements} elements (max abs"
            f" difference {stats.max_abs_error:.3g}, allowed {stats.atol:g} + {stats.rtol:g} * |x|): the"
            " output depends on uninitialised memory or on a race between threads.")
    detail = "bitwise equal" if data["bitwise"] else f"equal within {stats.atol:g} (not bitwise)"
    return CheckResult("determinism", "correctness", True, detail)
