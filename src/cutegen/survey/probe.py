"""The trivial-solution probe of one task, run in this process, and its check against the tasks known
to be degenerate.

For each tolerance of the two tracks (1e-4 and 1e-2), the reference is run on two input sets from
different seeds (weights from seed 0, training mode as the evaluator builds it) and every trivial
answer of `evaluate.probe.trivial_mismatch_fractions` (zeros, a constant, a copy of an input) is
measured: a task is flagged when an answer passes on both input sets, and nearly trivial when an
answer fails some of the elements but at most NEAR_TRIVIAL_FRACTION of them. `judge` compares the
flags with the tasks EVALUATION.md lists as exactly or nearly constant: the list is the probe's own
check (a probe that flags nothing would pass every task and say so in its verdict).
"""

from __future__ import annotations

import re
import time
from typing import Any

from cutegen.evaluate.compare import flatten_outputs
from cutegen.evaluate.correctness import lowest_precision, tensors_of
from cutegen.evaluate.probe import trivial_mismatch_fractions
from cutegen.records import Task
from cutegen.tasks import task_module

# EVALUATION.md, "Known task problems": outputs exactly 0 or one constant (must be flagged at 1e-4),
# and outputs that are nearly constant (a constant may fail at 1e-4, and even at 1e-2 on a few elements:
# each must be flagged or nearly trivial at one of the tolerances).
MUST_FLAG = frozenset({"level2/9", "level2/80", "level2/83", "level2/58", "level2/36", "level2/23", "level1/23",
                       "level1/37"})
NEARLY_CONSTANT = frozenset({"level1/39", "level1/49", "level1/53", "level2/38", "level2/42", "level2/45", "level2/49",
                             "level2/66", "level2/84", "level2/93", "level2/99"})
TOLERANCES = (1e-4, 1e-2)
# A trivial answer wrong on at most this fraction of the output (one element in a thousand) leaves the
# task's check resting on a handful of elements; level2/84 (a softmax over 8192 columns) is one: zeros
# are within 1e-2 of every element but the few past 0.0101.
NEAR_TRIVIAL_FRACTION = 1e-3
SEEDS = (1, 2)
MODE = "train"  # the module mode of the reference, as the evaluator builds it


def task_order(task_id: str) -> tuple[Any, ...]:
    """Sort key of a task id: level2/9 before level2/10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", task_id))


def reference_run(module: Any, seed: int, device: str) -> tuple[list[Any], list[Any]]:
    """(outputs, inputs) of the reference on `device` for one seed; weights from seed 0 every time. The
    model stays in training mode, as the evaluator and the baselines run it: in eval mode a fresh
    BatchNorm is the identity (level1/33 was flagged as an input copy that way)."""
    import torch  # lazy: the CLI imports this package at start

    torch.set_default_device(device)  # inputs and weights are created on the device directly
    try:
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).to(device)
        torch.manual_seed(seed)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
        with torch.no_grad():
            outputs = flatten_outputs(model(*inputs))
        if device == "cuda":
            torch.cuda.synchronize()
    finally:
        torch.set_default_device(None)
    return outputs, inputs


def output_summary(outputs: list[Any]) -> dict[str, Any]:
    """Shape, dtype and (for a float output) mean, spread and largest magnitude of the first output."""
    import torch  # lazy: loading torch takes seconds

    first = outputs[0]
    if not isinstance(first, torch.Tensor) or not first.is_floating_point() or first.numel() == 0:
        return {"shape": list(getattr(first, "shape", [])), "dtype": str(getattr(first, "dtype", type(first)))}
    values = first.detach().double()
    return {"shape": list(first.shape), "dtype": str(first.dtype), "mean": float(values.mean()),
            "std": float(values.std()) if values.numel() > 1 else 0.0, "max_abs": float(values.abs().max())}


def probe_task(task: Task, device: str) -> dict[str, Any]:
    """At each tolerance: the trivial answers passing on every seed (`trivial@TOL`), each answer's
    largest fraction of failed elements over the seeds (`mismatch@TOL`) and the answers failing at most
    NEAR_TRIVIAL_FRACTION of them but not none (`near_trivial@TOL`); also the first output's statistics
    and `precision`: the lowest-precision float dtype among inputs and outputs (as the evaluator picks
    the tolerance and the speed-of-light peak). The caller sets the track's TF32 flags."""
    import torch  # lazy: loading torch takes seconds

    started = time.perf_counter()
    module = task_module(task)
    worst: dict[float, dict[str, float]] = {tol: {} for tol in TOLERANCES}
    summary: dict[str, Any] = {}
    for seed in SEEDS:
        outputs, inputs = reference_run(module, seed, device)
        if not summary:
            summary = output_summary(outputs)
            summary["precision"] = lowest_precision(tensors_of(inputs) + tensors_of(outputs))
        for tol in TOLERANCES:
            for name, failed in trivial_mismatch_fractions(outputs, inputs, tol, tol).items():
                worst[tol][name] = max(failed, worst[tol].get(name, 0.0))
        del outputs, inputs
        if device == "cuda":
            torch.cuda.empty_cache()
    row = {"task_id": task.task_id, "name": task.name, "s": round(time.perf_counter() - started, 2), "mode": MODE,
           **summary}
    for tol in TOLERANCES:
        row[f"trivial@{tol:g}"] = sorted(name for name, failed in worst[tol].items() if failed == 0.0)
        row[f"near_trivial@{tol:g}"] = sorted(name for name, failed in worst[tol].items()
                                              if 0.0 < failed <= NEAR_TRIVIAL_FRACTION)
        row[f"mismatch@{tol:g}"] = {name: float(f"{failed:.3g}") for name, failed in sorted(worst[tol].items())}
    return row


def found(row: dict[str, Any]) -> bool:
    """The probe found the task trivial or nearly so, at either tolerance."""
    return any(row.get(f"{kind}@{tol:g}") for kind in ("trivial", "near_trivial") for tol in TOLERANCES)


def judge(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe's rows against the known lists: OK when every task listed as constant that was probed
    is flagged at 1e-4 and every one listed as nearly constant is flagged or nearly trivial."""
    flagged = {r["task_id"] for r in rows if r.get("trivial@0.0001")}
    seen = {r["task_id"] for r in rows if "error" not in r}
    must = MUST_FLAG & seen
    nearly = NEARLY_CONSTANT & seen
    nearly_found = nearly & {r["task_id"] for r in rows if found(r)}
    return {
        "must_flag_found": sorted(must & flagged, key=task_order),
        "must_flag_missed": sorted(must - flagged, key=task_order),
        "nearly_constant_flagged": sorted(NEARLY_CONSTANT & flagged, key=task_order),
        "nearly_constant_found": sorted(nearly_found, key=task_order),
        "nearly_constant_missed": sorted(nearly - nearly_found, key=task_order),
        "flagged_not_listed": sorted(flagged - MUST_FLAG - NEARLY_CONSTANT, key=task_order),
        "flagged_at_1e-4": len(flagged),
        "flagged_at_1e-2": sum(bool(r.get("trivial@0.01")) for r in rows),
        "near_trivial_at_1e-2": sum(bool(r.get("near_trivial@0.01")) and not r.get("trivial@0.01") for r in rows),
        "tasks_probed": len(seen),
        "errors": sum("error" in r for r in rows),
        "verdict": "OK" if must and not (must - flagged) and not (nearly - nearly_found) else "CHECK",
    }
