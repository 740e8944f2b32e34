"""Where a timed call's check goes on a large task: the reference process's parts of one
`compare_fresh` (ReferenceSession), each timed on its own on the GPU, after giving the cache back to
the driver as compare_fresh does and again with the cache kept. Calls the package's functions, no CLI.

    python3 bench/timed_compare_h200.py --task KB/level1/36_RMSNorm_.py --out DIR [--repeats 3]

Writes DIR/timed-compare-h200.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

import torch  # noqa: E402
from _common import load_module  # noqa: E402

from cutegen.evaluate.checks_dynamic import check_nonfinite  # noqa: E402
from cutegen.evaluate.compare import compare_outputs, compare_precision, first_mismatches  # noqa: E402
from cutegen.evaluate.transfer import export_outputs, open_outputs  # noqa: E402
from cutegen.manifest import machine_manifest  # noqa: E402
from cutegen.evaluate.correctness import (build_model, exact_model, make_inputs, precision_basis,  # noqa: E402
                                          run_reference)


def seconds(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    began = time.perf_counter()
    value = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - began, value


def exporter(conn, shape: list[int], via: str, folder: str) -> None:
    """The candidate's side in a process of its own: a fresh output, exported as the worker does."""
    out = torch.rand(shape, device="cuda")
    for _ in range(2):
        took, (descriptor, keep) = seconds(lambda: export_outputs([out], Path(folder), via))
        conn.send((took, descriptor))
        conn.recv()  # the reader is done
        del keep


def transfer_parts(shape: list[int], via: str, folder: Path, parts: dict[str, list[float]]) -> None:
    """Export in another process, then open and compare here (twice), as a timed call's check does."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=exporter, args=(theirs, shape, via, str(folder)))
    child.start()
    expected = [{"dtype": "float32", "shape": shape}]
    for _ in range(2):
        took, descriptor = mine.recv()
        parts.setdefault(f"{via}: export (other process)", []).append(took)
        began = time.perf_counter()
        with open_outputs({"leaves": descriptor["leaves"]}, expected, torch.device("cuda")) as outs:
            opened = time.perf_counter()
            compare_outputs(outs[0], outs[0], 1e-4, 1e-4)
            torch.cuda.synchronize()
            compared = time.perf_counter()
        parts.setdefault(f"{via}: open", []).append(opened - began)
        parts.setdefault(f"{via}: compare", []).append(compared - opened)
        parts.setdefault(f"{via}: close", []).append(time.perf_counter() - compared)
        mine.send(True)
    child.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    module = load_module(args.task, "task")
    device = torch.device("cuda")
    model = build_model(module.Model, module.get_init_inputs(), 0, device)
    model64 = exact_model(model)
    parts: dict[str, list[float]] = {}
    for keep_cache in (False, True):
        for k in range(args.repeats):
            if not keep_cache:
                torch.cuda.empty_cache()
            prefix = "kept cache: " if keep_cache else "cache given back: "
            took, inputs = seconds(lambda: make_inputs(module, 100 + k, None, device, device))
            parts.setdefault(prefix + "draw inputs", []).append(took)
            took, (ref, _) = seconds(lambda: run_reference(model, inputs, device, device))
            parts.setdefault(prefix + "reference forward", []).append(took)
            took, (basis, _) = seconds(lambda: precision_basis(model64, inputs, ref, device, 7 + k))
            parts.setdefault(prefix + "float64 basis (3 forwards)", []).append(took)
            # An honest candidate's output: the reference's, off by a few ulps (another summation order).
            candidate = ref * (1 + 2e-7 * torch.randn_like(ref))
            took, _ = seconds(lambda: compare_outputs(candidate, ref, 1e-4, 1e-4))
            parts.setdefault(prefix + "compare_outputs", []).append(took)
            took, _ = seconds(lambda: check_nonfinite(candidate, ref))
            parts.setdefault(prefix + "check_nonfinite", []).append(took)
            took, _ = seconds(lambda: list(first_mismatches(candidate, ref, 1e-4, 1e-4)))
            parts.setdefault(prefix + "first_mismatches", []).append(took)
            took, _ = seconds(lambda: compare_precision(candidate, ref, basis, 1e-4, 1e-4))
            parts.setdefault(prefix + "compare_precision", []).append(took)
            del inputs, ref, candidate, basis
    with torch.no_grad():
        shape = list(model(*make_inputs(module, 1, None, device, device)).shape)
    torch.cuda.empty_cache()
    for via in ("auto", "file"):
        with tempfile.TemporaryDirectory() as folder:  # (the worker's scratch folder: not shipped back)
            transfer_parts(shape, via, Path(folder), parts)
    rows = {name: round(statistics.median(v), 3) for name, v in parts.items()}
    props = torch.cuda.get_device_properties(0)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = machine_manifest()
    (args.out / "timed-compare-h200.json").write_text(json.dumps({"task": args.task.name, "device": props.name,
                                                                  "torch": torch.__version__, "seconds": parts,
                                                                  "manifest": manifest}, indent=1))
    lines = [f"# One timed call's check, part by part: {args.task.name}", "",
             f"{props.name}, torch {torch.__version__}; median of {args.repeats} each.", "",
             "| part | seconds |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows.items()], "",
             "```json", json.dumps(manifest, indent=1), "```"]
    (args.out / "timed-compare-h200.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
