"""How well the kernel library finds related kernels, over KernelBench level 1 and level 2.

A library is built from the repository's accepted plain-CUDA and CuTe candidates (bench/candidates/cuda,
bench/candidates/throughput, examples/candidates) with the verdicts measured on the H200 and kept in
bench/results: a candidate enters only when a stored passing verdict judged its current source (same
sha256), or, for the example kernels, whose honest-fixture rows keep no hash, when a row accepted and
timed it. Then, for every task, the op classes of the three nearest kernels of other tasks, as a
generate prompt for the task would get them (backend cute, fp32 track, on sm_90).

    python3 bench/library_retrieval.py KERNELBENCH [--out bench/results/library-retrieval.md] [--library FILE]

CPU only: tasks are traced on the meta device. Calls only public functions of cutegen.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # fixture_headers: which task an example candidate is for

from fixture_headers import task_path  # noqa: E402

from cutegen.config import LibraryConfig  # noqa: E402
from cutegen.journal import from_json  # noqa: E402
from cutegen.library import KernelLibrary, arch_name, entry_from_verdict, new_entry, provenance, task_signature  # noqa: E402
from cutegen.records import KernelMeasurement, Verdict  # noqa: E402
from cutegen.tasks import load_task, load_tasks, source_sha256  # noqa: E402

FOLDERS = ("bench/candidates/cuda", "bench/candidates/throughput", "examples/candidates")
# The runs of record first: a kernel measured in several keeps its first measurement.
VERDICT_FILES = ("partH", "partG", "partF", "partE", "partD", "partC", "partB", "partA", "part2", "part1")
HONEST_FILE = "bench/results/evaluator-h200-honest-rounds.json"


def verdict_records(data: object) -> list[dict]:
    """Every stored Verdict record in a results file, wherever it is nested."""
    if isinstance(data, dict):
        own = [data] if {"candidate_sha256", "passed", "track", "backend"} <= set(data) else []
        return own + [r for value in data.values() for r in verdict_records(value)]
    return [r for value in data for r in verdict_records(value)] if isinstance(data, list) else []


def build(store: KernelLibrary, suite: dict) -> int:
    files = {source_sha256(p.read_text()): p for folder in FOLDERS for p in sorted((REPO / folder).glob("*.py"))}
    signatures: dict[str, object] = {}

    def add(task, make) -> None:
        signatures.setdefault(task.task_id, task_signature(task))
        store.add(make(signatures[task.task_id]))

    for part in VERDICT_FILES:
        name = f"bench/results/throughput-h200-{part}.json"
        data = json.loads((REPO / name).read_text())
        arch, device = arch_name(data["manifest"]["gpu_capability"]), data["manifest"]["gpu_name"]
        for record in verdict_records(data):
            path = files.get(record["candidate_sha256"])
            if record["passed"] and path is not None and record["task_id"] in suite:
                verdict, source = from_json(Verdict, record), path.read_text()
                add(suite[record["task_id"]], lambda sig: entry_from_verdict(
                    suite[record["task_id"]], sig, source, verdict, provenance(name, None, part), arch=arch,
                    device_name=device))
    data = json.loads((REPO / HONEST_FILE).read_text())
    arch, device = arch_name(data["manifest"]["gpu_capability"]), data["manifest"]["gpu_name"]
    for row in data["sections"]["honest"]["rows"]:
        if not row["fixture"].startswith("examples/") or row["status"] != "OK" or row.get("median_ms") is None:
            continue
        path = REPO / row["fixture"]
        task, s = load_task(task_path(path, REPO)), row["speedup_vs_eager"]
        measured = KernelMeasurement(row["median_ms"], row["median_ms"] * s if s else None, None, s,
                                     row["speedup_vs_compile"], row["sol_fraction"], None, row["feedback"])
        add(task, lambda sig: new_entry(
            task, sig, path.read_text(), backend=row["backend"], track="fp32", arch=arch, device_name=device,
            measured=measured, where=provenance(HONEST_FILE, None, f"round {row['round']}")))
    return len(store.entries())


def retrieve(store: KernelLibrary, suite: dict) -> list[dict]:
    rows = []
    for task in suite.values():
        signature = task_signature(task)
        found = store.neighbours(signature, backend="cute", track="fp32", task=task, k=3)
        rows.append({"task": task.task_id, "class": signature.op_class, "ops": signature.aten_ops,
                     "neighbours": [(e.task_id, e.signature.op_class, set(e.signature.aten_ops) & set(signature.aten_ops))
                                    for e, _ in found]})
    return rows


def report(rows: list[dict], store: KernelLibrary, suite_path: Path) -> str:
    entries = store.entries()
    classes: dict[str, set] = {}
    for e in entries:
        classes.setdefault(e.signature.op_class, set()).add(e.task_id)
    same = [r for r in rows if r["neighbours"] and r["neighbours"][0][1] == r["class"]]
    shared = [r for r in rows if r["neighbours"] and r["neighbours"][0][2]]
    covered = [r for r in rows if r["class"] in classes]
    lines = [
        "# Kernel library retrieval over KernelBench level 1 and level 2", "",
        f"Written by `python3 bench/library_retrieval.py {suite_path.name}` (CPU; tasks traced on the meta device).",
        f"The library: {len(entries)} accepted kernels of {len({e.task_id for e in entries})} tasks, measured on the"
        " H200 (bench/results), by op class: " + ", ".join(f"{c} {len(t)} task(s)" for c, t in sorted(classes.items()))
        + ". Each task's own kernels are left out of its neighbours, as in a prompt.", "",
        f"- tasks: {len(rows)}",
        f"- **top neighbour of the same op class: {len(same)} of {len(rows)} ({len(same) / len(rows):.0%})**;"
        f" of the {len(covered)} tasks whose class the library holds: {len(same)} ({len(same) / max(1, len(covered)):.0%})",
        f"- top neighbour sharing an aten op with the task: {len(shared)} of {len(rows)} ({len(shared) / len(rows):.0%})",
        "", "The ranking puts the op class first, so the first share measures which classes the library holds"
        " more than the ranking; the second is the finer one. Tasks whose top neighbour is of another class: "
        + (", ".join(f"{r['task']} ({r['class']})" for r in rows if r not in same) or "none") + ".",
        "", "| task | op class | neighbour 1 | neighbour 2 | neighbour 3 |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{task} ({cls}{', same' if cls == r['class'] else ''})" for task, cls, _ in r["neighbours"]]
        lines.append(f"| {r['task']} | {r['class']} | " + " | ".join(cells + ["-"] * (3 - len(cells))) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernelbench", type=Path, help="A KernelBench folder holding level1/ and level2/.")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "library-retrieval.md")
    parser.add_argument("--library", type=Path, default=None, help="The library file to build (default: a new"
                        " temporary one).")
    args = parser.parse_args()
    suite = {t.task_id: t for t in load_tasks(args.kernelbench, "level1,level2")}
    with tempfile.TemporaryDirectory() as scratch:
        store = KernelLibrary(LibraryConfig(path=args.library or Path(scratch) / "library.sqlite", arch="sm_90"))
        print(f"library: {build(store, suite)} kernels in {store.path}")
        rows = retrieve(store, suite)
        args.out.write_text(report(rows, store, args.kernelbench), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
