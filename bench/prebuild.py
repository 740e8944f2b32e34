"""Build every CuTe kernel the repository ships, in parallel, into one build cache.

    python3 bench/prebuild.py --cache DIR [--arch sm_90a] [--jobs N]

The example candidates (examples/candidates/) and the test fixtures that declare CuteKernels
(tests/fixtures/{honest,cheats,bench_candidates}/; not faults/, whose build_hang.py never finishes)
are built by `prebuild_candidates`, each in its own CPU worker, into DIR/build. The later steps of a
device call that use the same cache root (bench/h200_all.sh passes one to every step) then find these
builds cached instead of compiling them one at a time inside their evaluations. A build that fails is
listed, not fatal: the evaluation that needs it builds it again and judges the error.
Writes DIR/prebuild.json and prints one line per failure and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

FOLDERS = ("examples/candidates", "tests/fixtures/honest", "tests/fixtures/cheats", "tests/fixtures/bench_candidates")


def shipped_candidates() -> list[Path]:
    return [path for folder in FOLDERS for path in sorted((REPO / folder).glob("*.py"))
            if "CuteKernel" in path.read_text(encoding="utf-8")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="Cache root (builds go to DIR/build).")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    args = parser.parse_args()

    from cutegen.cli import env
    from cutegen.config import EvalConfig
    from cutegen.evaluate.pipeline import prebuild_candidates

    runtime = replace(env.runtime_config(), cache_dir=args.cache / "build", arch=args.arch)
    config = EvalConfig(device="cuda", cache_dir=args.cache / "eval", runtime=runtime, build_timeout_s=180.0)
    paths = shipped_candidates()
    started = time.perf_counter()
    rows = prebuild_candidates(paths, config, jobs=args.jobs)
    wall_s = time.perf_counter() - started
    for row in rows:
        if not row["ok"]:
            # A fixture whose first line expects a build failure (`# expect: build ...`) fails on purpose.
            expected = Path(row["path"]).read_text(encoding="utf-8").startswith("# expect: build")
            print(f"failed{' (as its fixture expects)' if expected else ''}: {Path(row['path']).relative_to(REPO)}:"
                  f" {(row['error'] or '').splitlines()[:1]}")
    args.cache.mkdir(parents=True, exist_ok=True)
    (args.cache / "prebuild.json").write_text(json.dumps({"wall_s": wall_s, "jobs": args.jobs, "rows": rows}, indent=1))
    print(f"prebuilt {sum(r['ok'] for r in rows)}/{len(rows)} candidate files in {wall_s:.0f} s with {args.jobs} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
