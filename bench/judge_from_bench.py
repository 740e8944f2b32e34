"""The judge table's plain-CUDA rows from a throughput part: bench/throughput_h200.py over
bench/candidates/cuda judges each file (sample 0) with the same judge, one evaluation at a time on the
GPU lane, with the builds beside it. This adds those verdicts to judge-h200.jsonl (replacing earlier
rows of the same files) and writes judge-h200.md again.

    python3 bench/judge_from_bench.py --part bench/results/throughput-h200-PART.json --out bench/results
    python3 bench/judge_from_bench.py --run RUN_DIR --out bench/results

`--run` reads a bench run directory instead (its verdicts.jsonl, and the machine from its bench.json):
the verdicts of a part cut short before it wrote its JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

from judge_h200 import result_row, write  # noqa: E402

from cutegen.tasks import source_sha256  # noqa: E402

CUDA = REPO / "bench" / "candidates" / "cuda"


def rows_of(verdicts: list[tuple[int, dict]], source: str) -> list[dict]:
    """A row per sample-0 verdict record whose candidate hash is its file's in bench/candidates/cuda (the
    other samples are variants of it): a row never stands for a file that was not judged as it is."""
    rows = []
    for sample, record in verdicts:
        if sample != 0 or not record:
            continue
        level, problem = record["task_id"].removeprefix("level").split("/")
        path = CUDA / f"level_{level}_problem_{problem}_sample_0_kernel.py"
        if not path.exists() or source_sha256(path.read_text()) != record["candidate_sha256"]:
            continue
        row = {"file": str(path.relative_to(REPO)), "backend": record["backend"], "expected": "pass", "layer": "",
               "twin": None}
        rows.append({**result_row(row, record), "source": source})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--part", type=Path, help="a throughput part's JSON")
    given.add_argument("--run", type=Path, help="a bench run directory (verdicts.jsonl, bench.json)")
    parser.add_argument("--out", type=Path, required=True, help="the folder of judge-h200.jsonl")
    args = parser.parse_args()
    if args.part:
        part = json.loads(args.part.read_text())
        verdicts = [(e.get("sample"), e.get("record")) for e in part["bench"]["verdicts"]]
        manifest, source = part["manifest"], f"throughput {part['part']}"
    else:
        lines = (args.run / "verdicts.jsonl").read_text().splitlines()
        verdicts = [(e.get("sample_id"), e.get("verdict")) for e in map(json.loads, lines)]
        manifest, source = json.loads((args.run / "bench.json").read_text())["sessions"][0], f"run {args.run.name}"
    added = rows_of(verdicts, source)
    log = args.out / "judge-h200.jsonl"
    kept = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    files = {r["file"] for r in added}
    results = [r for r in kept if r["file"] not in files] + added
    log.write_text("".join(json.dumps(r) + "\n" for r in results))
    write(args.out, results, manifest)
    print(f"{len(added)} rows from {args.part or args.run}: {sum(r['passed'] for r in added)} passed")


if __name__ == "__main__":
    main()
