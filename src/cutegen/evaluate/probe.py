"""The trivial-solution probe: would a kernel that does no work pass this task's correctness check?

Some tasks have outputs that are exactly or nearly constant (a ReLU after a negative shift, a
GroupNorm followed by a mean, a loss over iid inputs...), so returning zeros, one constant or a copy
of an input passes the tolerance check. A "speedup" on such a task measures nothing; the probe finds
these tasks from the reference outputs alone, once per task, and the report lists them separately.
"""

from __future__ import annotations

from typing import Any

from cutegen.evaluate.compare import CHUNK_ELEMENTS, _abs_diff, _threshold, compare_outputs, flatten_outputs


def _trivial_answers(refs: list[Any], inputs: list[Any]) -> dict[str, list[Any]]:
    """Candidate do-nothing outputs, each shaped like the reference outputs."""
    import torch  # imported here so that importing this module stays cheap

    tensors = [r for r in refs if isinstance(r, torch.Tensor)]
    if len(tensors) != len(refs) or not tensors:
        return {}
    answers = {
        "zeros": [torch.zeros_like(r) for r in tensors],
        "constant": [torch.full_like(r, _mean(r)) for r in tensors],
    }
    for i, value in enumerate(inputs):
        if isinstance(value, torch.Tensor) and all(value.shape == r.shape for r in tensors):
            answers[f"input_copy:{i}"] = [value.detach().to(r.device, r.dtype) for r in tensors]
    return answers


def _mean(tensor: Any) -> float:
    import torch  # lazy: loading torch takes seconds

    if tensor.numel() == 0:
        return 0.0
    values = tensor.detach().to(torch.float64)
    finite = values[torch.isfinite(values)]
    return float(finite.mean()) if finite.numel() else 0.0


def trivial_mismatch_fractions(ref_outputs: Any, inputs: list[Any], atol: float, rtol: float) -> dict[str, float]:
    """For each trivial answer ("zeros", "constant": each output's mean, "input_copy:i": input i, when
    every output has its shape), the fraction of the reference elements it fails under
    `|out - ref| <= atol + rtol * |ref|` on this one forward's result; 0.0 means it passes everywhere.

    `ref_outputs` is one forward's result (a tensor, or a tuple/list of tensors) and `inputs` the
    arguments that produced it. Outputs that are not all tensors are not probed (empty result). A small
    non-zero fraction marks a task whose check rests on a few elements: zeros are right almost
    everywhere, so the task barely tells a kernel from no kernel (reported, not a degenerate flag).
    """
    refs = flatten_outputs(ref_outputs)
    fractions = {}
    for name, answer in _trivial_answers(refs, list(inputs)).items():
        stats = compare_outputs(answer, refs, atol, rtol)
        fractions[name] = stats.mismatched_elements / stats.total_elements if stats.mismatched_elements else 0.0
    return fractions


def trivial_solution_probe(ref_outputs: Any, inputs: list[Any], atol: float, rtol: float) -> tuple[str, ...]:
    """Names of the trivial answers of `trivial_mismatch_fractions` that pass everywhere on these
    reference outputs. A non-empty result flags the task as degenerate; for several trials, call once
    per trial and keep the names that pass in all of them.

    The same rule as `trivial_mismatch_fractions`, without its counts: each answer is built chunk by
    chunk on the outputs' device (never a full-size zeros or copy) and dropped at its first failing
    element, so on a gigabyte output an answer that fails costs one chunk."""
    import torch  # lazy: loading torch takes seconds

    refs = flatten_outputs(ref_outputs)
    if not refs or not all(isinstance(r, torch.Tensor) for r in refs):
        return ()
    names = ["zeros", "constant"] + [f"input_copy:{i}" for i, x in enumerate(inputs)
                                     if isinstance(x, torch.Tensor) and all(x.shape == r.shape for r in refs)]
    means = [_mean(r) for r in refs]

    def chunk(name: str, leaf: int, r: Any, start: int) -> Any:
        if name == "zeros":
            return torch.zeros_like(r)
        if name == "constant":
            return torch.full_like(r, means[leaf])
        source = inputs[int(name.split(":")[1])].detach().reshape(-1)[start:start + r.numel()]
        return source.to(r.device, refs[leaf].dtype).to(torch.float64)

    passing = []
    for name in names:
        ok = True
        for leaf, ref in enumerate(refs):
            flat = ref.detach().reshape(-1)
            for start in range(0, flat.numel(), CHUNK_ELEMENTS):
                r = flat[start:start + CHUNK_ELEMENTS].to(torch.float64)
                answer = chunk(name, leaf, r, start).to(refs[leaf].dtype).to(torch.float64)
                if bool((_abs_diff(answer, r) > _threshold(r, atol, rtol)).any()):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            passing.append(name)
    return tuple(passing)
