"""The payloads the parent sends to start a worker's job: a task's reference, or one candidate.

Seeds are drawn here, in the parent, from os.urandom (correctness.unpredictable_seed): a reference
job carries every trial's seed; a candidate's job carries only the weight seeds (ModelNew must be
built as Model was), and each trial's seed reaches the candidate's worker with that trial.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cutegen.config import HALF_DTYPES
from cutegen.evaluate.correctness import trial_plan, unpredictable_seed
from cutegen.records import to_json


def _tolerances(config: Any) -> dict[str, list[float]]:
    return {d: list(config.tolerance(d)) for d in ("float32", "float64") + HALF_DTYPES}


def timing_spec(config: Any) -> dict[str, int]:
    return {"trials": config.timing_trials, "warmup": config.warmup_trials, "input_sets": config.timing_input_sets,
            "output_checks": config.timed_output_checks}


def reference_job(task: Any, config: Any, *, trials: int, adversarial: int, weight_seeds: int, probe: bool,
                  exact: bool = True, reusable: bool = False) -> dict[str, Any]:
    """The `reference` command's payload, with fresh seeds. `exact`: comparisons may use the float64
    result (only candidates' comparisons need it). `reusable`: the worker may take another task's
    reference job after `release` (a suite's baselines; never a process that serves candidates)."""

    return {
        "task": to_json(task),
        "device": config.device,
        "track": config.track,
        "tolerances": _tolerances(config),
        "init_seed": unpredictable_seed(),
        "weight_seeds": [unpredictable_seed() for _ in range(weight_seeds)],
        "trials": trial_plan(trials, adversarial, weight_seeds),
        "probe": probe,
        "exact": exact,
        "reusable": reusable,
        "timing": timing_spec(config),
    }


def candidate_job(task: Any, config: Any, reference_job: dict[str, Any], reference: dict[str, Any],
                  transfer: str = "auto") -> dict[str, Any]:
    """The `setup` command's payload: what the candidate's worker may know of the reference job
    (init and weight seeds: ModelNew is built as Model was) and of its result (the output spec).
    `transfer`: how it exports outputs (transfer.export_outputs)."""
    return {
        "transfer": transfer,
        "task": to_json(task),
        "device": config.device,
        "track": config.track,
        "backend": config.backend,
        "init_seed": reference_job["init_seed"],
        "weight_seeds": list(reference_job["weight_seeds"]),
        "spec": reference["spec"],
        "guard": config.guard,
        "landlock": config.confinement != "hashes",  # confine.py; "hashes": the parent's seal alone
        # The evaluator's build timeout governs (failure "build_timeout"), not nvcc's own.
        "runtime": to_json(replace(config.runtime, nvcc_timeout_s=config.build_timeout_s + 30.0)),
    }
