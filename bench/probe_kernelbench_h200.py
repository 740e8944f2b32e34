"""The trivial-solution probe over KernelBench, checked against the known degenerate tasks.

    python3 bench/probe_kernelbench_h200.py --out DIR [--kernelbench PATH] [--levels 1,2] [--budget-s 480]

For every task of the chosen levels: build the reference on the GPU (fp32 track: TF32 off; training
mode, as the evaluator runs it), run it on
two input sets from different seeds, and measure each trivial answer (`trivial_mismatch_fractions`)
at the fp32 tolerance (1e-4) and the tf32 tolerance (1e-2): it flags the task when it passes on both
input sets, and makes it nearly trivial when it fails some of the elements, but at most
NEAR_TRIVIAL_FRACTION of them, on each. The result is compared with the tasks EVALUATION.md lists as exactly or nearly constant
(the list is the check on the probe): every task listed as constant must be flagged at 1e-4, and
every task listed as nearly constant flagged or nearly trivial at one of the two tolerances.

Writes DIR/probe-kernelbench-h200.json and DIR/probe-kernelbench-h200.md (with the machine manifest)
after every level, so a run cut short keeps what it did. KernelBench is found at --kernelbench, else
$CUTEGEN_KERNELBENCH, else .kernelbench/ in the repo, else ../shared/kernelbench.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

from cutegen.evaluate.compare import flatten_outputs  # noqa: E402
from cutegen.evaluate.correctness import lowest_precision, tensors_of  # noqa: E402
from cutegen.evaluate.probe import trivial_mismatch_fractions  # noqa: E402
from cutegen.tasks import load_tasks, task_module  # noqa: E402

# EVALUATION.md, "Known task problems": outputs exactly 0 or one constant (must be flagged at 1e-4),
# and outputs that are nearly constant (a constant may fail at 1e-4, and even at 1e-2 on a few elements:
# each must be flagged or nearly trivial at one of the tolerances).
MUST_FLAG = {"level2/9", "level2/80", "level2/83", "level2/58", "level2/36", "level2/23", "level1/23", "level1/37"}
NEARLY_CONSTANT = {"level1/39", "level1/49", "level1/53", "level2/38", "level2/42", "level2/45", "level2/49",
                   "level2/66", "level2/84", "level2/93", "level2/99"}
TOLERANCES = (1e-4, 1e-2)
# A trivial answer wrong on at most this fraction of the output (one element in a thousand) leaves the
# task's check resting on a handful of elements; level2/84 (a softmax over 8192 columns) is one: zeros
# are within 1e-2 of every element but the few past 0.0101.
NEAR_TRIVIAL_FRACTION = 1e-3
SEEDS = (1, 2)


def task_order(task_id: str) -> tuple[Any, ...]:
    """Sort key of a task id: level2/9 before level2/10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", task_id))


def find_kernelbench(arg: str | None) -> Path:
    for candidate in (arg, os.environ.get("CUTEGEN_KERNELBENCH"), REPO / ".kernelbench",
                      REPO.parent / "shared" / "kernelbench"):
        if candidate and (Path(candidate) / "level1").is_dir():
            return Path(candidate)
    sys.exit("No KernelBench checkout found: pass --kernelbench PATH (a folder holding level1/, level2/...).")


MODE = "train"  # the module mode of the reference, as the evaluator builds it (`correctness.build_model`)


def reference_run(module: Any, seed: int, device: str = "cuda") -> tuple[list[Any], list[Any]]:
    """(outputs, inputs) of the reference on `device` for one seed; weights from seed 0 every time. The
    model stays in training mode, as the evaluator and the baselines run it: in eval mode a fresh
    BatchNorm is the identity (level1/33 was flagged as an input copy that way)."""
    import torch

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
    import torch

    first = outputs[0]
    if not isinstance(first, torch.Tensor) or not first.is_floating_point() or first.numel() == 0:
        return {"shape": list(getattr(first, "shape", [])), "dtype": str(getattr(first, "dtype", type(first)))}
    values = first.detach().double()
    return {"shape": list(first.shape), "dtype": str(first.dtype), "mean": float(values.mean()),
            "std": float(values.std()) if values.numel() > 1 else 0.0, "max_abs": float(values.abs().max())}


def probe_task(task: Any, device: str = "cuda") -> dict[str, Any]:
    """At each tolerance: the trivial answers passing on every seed (`trivial@TOL`), each answer's
    largest fraction of failed elements over the seeds (`mismatch@TOL`) and the answers failing at most
    NEAR_TRIVIAL_FRACTION of them but not none (`near_trivial@TOL`); also the first output's statistics
    and `precision`: the lowest-precision float dtype among inputs and outputs (as the evaluator picks
    the tolerance and the speed-of-light peak)."""
    import torch

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


def near_cell(row: dict[str, Any], tol: float) -> str:
    """The nearly trivial answers at `tol`, each with the fraction of elements it fails."""
    fractions = row.get(f"mismatch@{tol:g}", {})
    return ", ".join(f"{name} ({fractions.get(name, 0):.2g})" for name in row.get(f"near_trivial@{tol:g}", [])) or "-"


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe-kernelbench-h200.json").write_text(json.dumps(result, indent=2, default=str))
    summary = result["summary"]
    lines = [
        "# Trivial-solution probe over KernelBench (H200)", "",
        f"Tasks probed: {summary['tasks_probed']}, errors: {summary['errors']}, flagged at 1e-4:"
        f" {summary['flagged_at_1e-4']}, at 1e-2: {summary['flagged_at_1e-2']}. Verdict: **{summary['verdict']}**.",
        "",
        f"- listed as constant and found: {', '.join(summary['must_flag_found']) or '-'}",
        f"- listed as constant and MISSED: {', '.join(summary['must_flag_missed']) or '-'}",
        f"- listed as nearly constant, flagged at 1e-4: {', '.join(summary['nearly_constant_flagged']) or '-'}",
        "- listed as nearly constant, flagged or nearly trivial at 1e-4 or 1e-2:"
        f" {', '.join(summary['nearly_constant_found']) or '-'}; MISSED: {', '.join(summary['nearly_constant_missed']) or '-'}",
        f"- flagged but not listed: {', '.join(summary['flagged_not_listed']) or '-'}",
        "",
        "| task | trivial @1e-4 | trivial @1e-2 | nearly trivial @1e-2 | mean | std | max abs |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        if found(row) or "error" in row:
            lines.append(f"| {row['task_id']} {row.get('name', '')} | {', '.join(row.get('trivial@0.0001', [])) or '-'}"
                         f" | {', '.join(row.get('trivial@0.01', [])) or '-'} | {near_cell(row, 0.01)}"
                         f" | {row.get('mean', row.get('error', ''))!s:.12}"
                         f" | {row.get('std', '')!s:.10} | {row.get('max_abs', '')!s:.10} |")
    lines += ["", "Machine:", "", "```", json.dumps(result.get("manifest"), indent=1, default=str), "```", ""]
    (out / "probe-kernelbench-h200.md").write_text("\n".join(lines))


def manifest() -> dict[str, Any] | None:
    try:
        from cutegen.manifest import machine_manifest

        return machine_manifest()
    except Exception as err:  # noqa: BLE001 - the manifest must not cost the measurements
        return {"error": f"{type(err).__name__}: {err}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--kernelbench")
    parser.add_argument("--levels", default="1,2")
    parser.add_argument("--budget-s", type=float, default=480.0)
    args = parser.parse_args()

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 track's reference
    torch.backends.cudnn.allow_tf32 = False
    root = find_kernelbench(args.kernelbench)
    deadline = time.perf_counter() + args.budget_s
    result: dict[str, Any] = {"kernelbench": str(root), "manifest": manifest(), "rows": [], "skipped": []}
    for level in args.levels.split(","):
        for task in load_tasks(root, select=f"level{level.strip()}"):
            if time.perf_counter() > deadline:
                result["skipped"].append(task.task_id)
                continue
            try:
                row = probe_task(task)
            except Exception as err:  # noqa: BLE001 - one broken task must not end the run
                row = {"task_id": task.task_id, "name": task.name, "error": f"{type(err).__name__}: {err}"[:400],
                       "trace": traceback.format_exc()[-800:]}
                torch.cuda.empty_cache()
            result["rows"].append(row)
            print(row["task_id"], row.get("trivial@0.0001"), row.get("error", ""), flush=True)
        result["summary"] = judge(result["rows"])
        write(args.out, result)
    result["summary"] = judge(result["rows"])
    write(args.out, result)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
