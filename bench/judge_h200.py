"""Every judge fixture on a GPU, one evaluation at a time: the class, the expected verdict, the verdict,
the check that fired, its median against its honest twin's, and the parent-clock ratio.

    python3 bench/judge_h200.py --out DIR [--sections cheats,honest,cuda,structure] [--kernelbench KB]

- cheats: tests/fixtures/cheats/*.py under the first backend each applies to (`layer: guard-off`
  ones with the in-process guard off, `layer: timing` ones with timing on); `caught-by: none` ones
  must pass no faster than their `twin:`.
- honest: tests/fixtures/honest/*.py and examples/candidates/*.py must pass.
- cuda: bench/candidates/cuda/*.py (plain CUDA for KernelBench tasks) must pass (needs --kernelbench).
- structure: bench/candidates/structure/*.py (honest kernels under the reference's work bound).
  bench/judge_from_bench.py can take these rows from a throughput part over that folder instead.
Appends each result to DIR/judge-h200.jsonl as it ends (a run cut short keeps them) and writes
DIR/judge-h200.md with the machine manifest. Only public functions of cutegen are called.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from fixture_headers import backends, header, task_path  # noqa: E402

from cutegen.config import EvalConfig  # noqa: E402
from cutegen.evaluate.pipeline import evaluate_candidate  # noqa: E402
from cutegen.evaluate.service import Evaluator  # noqa: E402
from cutegen.manifest import machine_manifest  # noqa: E402
from cutegen.records import to_json  # noqa: E402
from cutegen.tasks import load_task  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"


def plan(sections: list[str], kernelbench: Path | None) -> list[dict]:
    """(file, task, backend, expected, layer, twin) for each evaluation, section by section in the
    order given."""
    rows = []
    for section in sections:
        if section == "cheats":
            for path in sorted((FIXTURES / "cheats").glob("[0-9][0-9]_*.py")):
                fields = header(path)
                rows.append({"file": path, "task": task_path(path, REPO), "backend": backends(path)[0],
                             "expected": fields["caught-by"], "layer": fields.get("layer", ""),
                             "twin": fields.get("twin")})
        elif section == "honest":
            for path in sorted((FIXTURES / "honest").glob("*.py")) + sorted((REPO / "examples" / "candidates").glob("*.py")):
                rows.append({"file": path, "task": task_path(path, REPO), "backend": backends(path)[0],
                             "expected": "pass", "layer": "", "twin": None})
        elif section in ("cuda", "structure") and kernelbench is not None:
            for path in sorted((REPO / "bench" / "candidates" / section).glob("level_*.py")):
                level, problem = re.match(r"level_(\d+)_problem_(\d+)_", path.name).groups()
                rows.append({"file": path, "task": next((kernelbench / f"level{level}").glob(f"{problem}_*.py")),
                             "backend": header(path).get("backend", "cuda" if section == "cuda" else "torch"),
                             "expected": "pass", "layer": "", "twin": None})
    return rows


def judge(row: dict, base: EvalConfig, service: Evaluator) -> dict:
    config = replace(base, backend=row["backend"], guard=row["layer"] != "guard-off")
    verdict = evaluate_candidate(row["file"], load_task(row["task"]), config, service)
    return result_row({**row, "file": str(row["file"].relative_to(REPO))}, to_json(verdict))


def result_row(row: dict, record: dict) -> dict:
    """A table row: the plan's file, backend, expected, layer and twin; the verdict record's (JSON) say."""
    checks = record.get("checks") or []
    fired = [c["name"] for c in checks if not c["passed"]] + [c["name"] for c in checks if c["name"] == "beat_work_bound"]
    return {**{key: row[key] for key in ("file", "backend", "expected", "layer", "twin")},
            "passed": record["passed"], "failure": record["failure"], "fired": fired,
            "median_ms": (record.get("timing") or {}).get("median_ms"),
            "parent_clock_ratio": record.get("parent_clock_ratio"), "gpu_s": record.get("gpu_s"),
            "beat_work_bound": bool(record.get("beat_work_bound")), "feedback": record["feedback"][:300]}


def outcome(result: dict, by_file: dict[str, dict]) -> str:
    """OK when the verdict is the expected one; for a cheat that passes (`none`), OK when it is timed
    no faster than its twin (within 10%)."""
    if result["expected"] == "pass":
        return "OK" if result["passed"] else "NOT-OK"
    if result["expected"] != "none":
        return "OK" if result["failure"] == result["expected"] else ("OK (earlier: %s)" % result["failure"]
                                                                       if result["failure"] else "NOT-OK")
    twin = by_file.get(result["twin"] or "")
    if not result["passed"]:
        return f"OK (rejected: {result['failure']})"
    if twin and twin["median_ms"] and result["median_ms"] and result["median_ms"] >= 0.9 * twin["median_ms"]:
        return "OK (no faster than its twin)"
    return "NOT-OK" if twin else "twin not measured"


def write(out: Path, results: list[dict], manifest: dict) -> None:
    by_file = {r["file"]: r for r in results}
    lines = ["# The judge on the H200, one evaluation at a time", "", "```", json.dumps(manifest, indent=1), "```", "",
             "| fixture | backend | layer | expected | verdict | checks that failed | median ms | twin median ms"
             " | parent/reported | outcome |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        twin = by_file.get(r["twin"] or "", {})
        fmt = lambda v: f"{v:.4g}" if isinstance(v, (int, float)) and v is not None else "-"  # noqa: E731
        lines.append(f"| {r['file']} | {r['backend']} | {r['layer'] or '-'} | {r['expected']} |"
                     f" {'pass' if r['passed'] else 'reject'} | {', '.join(r['fired']) or '-'} |"
                     f" {fmt(r['median_ms'])} | {fmt(twin.get('median_ms'))} | {fmt(r['parent_clock_ratio'])} |"
                     f" {outcome(r, by_file)} |")
    ok = sum(outcome(r, by_file).startswith("OK") for r in results)
    lines += ["", f"{ok} of {len(results)} as expected."]
    (out / "judge-h200.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default="cheats,honest,cuda,structure")
    parser.add_argument("--kernelbench", type=Path)
    parser.add_argument("--cache", type=Path, help="evaluation and build caches (kept between calls)")
    parser.add_argument("--only", default="", help="a regular expression on file names")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "judge-h200.jsonl"
    base = EvalConfig(device="cuda", compile_baseline=False, run_timeout_s=180.0, build_timeout_s=240.0,
                      **({"cache_dir": args.cache / "eval"} if args.cache else {}))
    if args.cache:
        base = replace(base, runtime=replace(base.runtime, cache_dir=args.cache / "build"))
    done = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    seen = {(r["file"], r["backend"]) for r in done}
    with Evaluator("cuda") as service:
        # load_inline candidates last: torch builds them on this machine, 30-60 s each
        rows = sorted(plan(args.sections.split(","), args.kernelbench), key=lambda r: "load_inline" in r["file"].read_text())
        for row in rows:
            key = (str(row["file"].relative_to(REPO)), row["backend"])
            if key in seen or not re.search(args.only, key[0]):
                continue
            result = judge(row, base, service)
            done.append(result)
            with log.open("a") as handle:
                handle.write(json.dumps(result) + "\n")
            print(f"{key[0]} {row['backend']}: {'pass' if result['passed'] else result['failure']}", flush=True)
            write(args.out, done, machine_manifest())
    write(args.out, done, machine_manifest())


if __name__ == "__main__":
    main()
