"""A split run's builds, prebuilt without the GPU and found by the GPU side: nvcc calls and GPU seconds.

    python3 bench/split_build_h200.py --out DIR [--select conv2d,matmul] [--dry-run] [--prebuilt CACHE]

`cutegen bench examples/tasks --evaluate` over tests/fixtures/bench_candidates runs on the GPU twice
from empty caches: before, nothing prebuilt; after, `cutegen prebuild --arch sm_90a` ran as a machine
without a GPU (no visible device, CUTLASS headers at another path) or on another machine (--prebuilt
CACHE: its `prebuild --json` in CACHE/prebuild.json, `machine --json` in CACHE/machine.json). An nvcc
wrapper logs each call: after the prebuild no GPU-side call may build a kernel (exit 1 otherwise; a
failed build is not cached: it is compiled again to judge its error). --dry-run (no GPU): the GPU side
runs `cutegen prebuild`, which must build nothing. Writes DIR/split-build-h200.{json,md}."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TASKS, CANDIDATES = REPO / "examples" / "tasks", REPO / "tests" / "fixtures" / "bench_candidates"
SIX = "conv2d,layer_norm,linear_gelu,matmul,row_softmax,swish_scale"


def calls(log: Path) -> dict[str, Any]:
    rows = [line.split() for line in log.read_text().splitlines()] if log.is_file() else []
    return {"nvcc_calls": len(rows), "nvcc_s": round(sum(float(end) - float(start) for end, start, *_ in rows), 1),
            "failed_calls": sum(rc != "0" for _, _, rc, *_ in rows)}


def side(work: Path, name: str, base: dict[str, str], wrapper: str, **extra: str) -> dict[str, str]:  # cache, nvcc
    (work / name).mkdir(parents=True, exist_ok=True), (work / name / "nvcc").write_text(wrapper)
    (work / name / "nvcc").chmod(0o755)
    return {**base, "CUTEGEN_CACHE": str(work / name / "cache"), "CUTEGEN_NVCC": str(work / name / "nvcc"), **extra}


def per_task(run_dir: Path) -> dict[str, Any]:
    """GPU seconds (results.json) and the candidates' build seconds in the GPU lane and the CPU pool."""
    rows = {r["task_id"]: {"gpu_s": r.get("gpu_s") or 0.0, "lane_build_s": 0.0, "pool_build_s": 0.0}
            for r in json.loads((run_dir / "results.json").read_text())["results"]}
    for record in map(json.loads, (run_dir / "verdicts.jsonl").read_text().splitlines()):
        v, row = record["verdict"] or {}, rows[record["task_id"]]
        row["lane_build_s"] += v.get("build_s") or 0.0
        row["pool_build_s"] += dict(v.get("stage_s") or []).get("build_pool", 0.0)
    return rows


def prepare(work: Path, select: str, base: dict[str, str]) -> tuple[Path, str, Path, Path]:
    """The selected tasks' candidate files, the nvcc wrapper, the headers and a second root holding them."""
    (folder := work / "candidates").mkdir(parents=True, exist_ok=True)
    for path in (p for p in CANDIDATES.glob("*.py") if p.stem.split("_sample_")[0] in select.split(",")):
        (folder / path.name).write_text(path.read_text())
    real = subprocess.run(["which", "nvcc"], capture_output=True, text=True).stdout.strip() or "/usr/local/cuda/bin/nvcc"
    # nvcc, logging each compile (not --version) beside itself (workers do not pass every variable on)
    wrapper = (f'#!/bin/sh\ncase " $* " in *" --version "*) exec "{real}" "$@";; esac\nstart=$(date +%s.%N)\n'
               f'"{real}" "$@"\nrc=$?\necho "$(date +%s.%N) $start $rc $PWD" >> "$(dirname "$0")/nvcc.log"\nexit $rc\n')
    find = "import cutegen.config as c, cutegen.runtime as r; print(r.find_cutlass_include(c.RuntimeConfig()))"
    headers = Path(subprocess.run([sys.executable, "-c", find], capture_output=True, text=True, env=base).stdout.strip())
    root = work / "cpu-side-root" / "include"  # the same headers at another path: another install root
    root.mkdir(parents=True, exist_ok=True)
    for name in (n for n in ("cute", "cutlass") if not (root / n).exists()):
        (root / name).symlink_to(headers / name, target_is_directory=True)
    return folder, wrapper, headers, root


def step(args: list[str], env: dict[str, str], run_dir: Path | None = None) -> dict[str, Any]:
    started = time.perf_counter()  # the CLI's exit status, wall seconds and nvcc calls (its stderr: ours)
    done = subprocess.run([sys.executable, "-m", "cutegen", *args], env=env, stdout=subprocess.PIPE, text=True,
                          timeout=1800, cwd=REPO)
    out, log = done.stdout, Path(env["CUTEGEN_NVCC"]).parent / "nvcc.log"
    row = {"exit": done.returncode, "wall_s": round(time.perf_counter() - started, 1), **calls(log)}
    extra = json.loads(out) if args[0] == "prebuild" else {}  # prebuild --json: the counts of its builds
    if run_dir is not None:
        extra = {"tasks": per_task(run_dir), "tail": out[-1500:]}
    return {**row, **{k: v for k, v in extra.items() if k not in ("results", "nvcc_s", "wall_s")}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work, runs = args.out / "work", args.out / "work" / "runs"
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUTEGEN_")}
    base["PYTHONPATH"] = str(REPO / "src") + os.pathsep + base.get("PYTHONPATH", "")
    folder, wrapper, headers, root = prepare(work, args.select, base)
    bench = ["bench", str(TASKS), "--evaluate", str(folder), "--select", args.select, "--no-report",
             "--no-compile-baseline", "--runs-dir", str(runs)]  # builds differ; torch.compile would add noise
    prebuild = ["prebuild", str(folder), "--arch", "sm_90a", "--jobs", str(args.jobs), "--json"]
    result: dict[str, Any] = {"select": args.select, "headers": {"gpu_side": str(headers), "cpu_side": str(root)}}
    if not args.dry_run:
        result["before"] = step([*bench, "--run-id", "before"], side(work, "before", base, wrapper), runs / "before")
    if args.prebuilt:  # built on another machine: its report, and a copy of its cache for the GPU side
        report, drop = json.loads((args.prebuilt / "prebuild.json").read_text()), ("results", "target", "build_cache")
        result["prebuild"] = {**{k: v for k, v in report.items() if k not in drop}, "exit": 0, "nvcc_calls": "-",
                              "nvcc_s": "-", "wall_s": round(report["wall_s"], 1),
                              "machine": json.loads((args.prebuilt / "machine.json").read_text())["manifest"]}
        shutil.copytree(args.prebuilt, work / "after" / "cache", dirs_exist_ok=True)
    else:
        cpu = side(work, "cpu-side", base, wrapper, CUDA_VISIBLE_DEVICES="", CUTEGEN_CUTLASS_INCLUDE=str(root),
                   CUTEGEN_CACHE=str(work / "after" / "cache"))
        result["prebuild"] = step(prebuild, cpu)
    gpu = side(work, "after", base, wrapper)
    result["after"] = step(prebuild, gpu) if args.dry_run else step([*bench, "--run-id", "after"], gpu, runs / "after")
    # A prebuilt kernel needs no nvcc on the GPU side; a failed build is not cached and is compiled again.
    after = result["after"]
    result.update(gpu_side_nvcc_calls=after["nvcc_calls"], gpu_side_successful_calls=after["nvcc_calls"] - after["failed_calls"])
    return result


def markdown(r: dict[str, Any]) -> str:
    other = ", ".join(f"{k} {r['prebuild'].get('machine', {}).get(k)}" for k in ("platform", "cpu_count", "torch_version"))
    lines = ["# Split run: builds made without the GPU, found by the GPU side", "",
             f"Tasks {r['select']}; candidates tests/fixtures/bench_candidates. Prebuild on the CPU side"
             + (f" (another machine, no GPU: {other})" if "machine" in r["prebuild"] else "") + ":"
             f" {r['prebuild']['kernels_built']} kernel(s) built, {r['prebuild']['failed']} candidate(s) failed to"
             f" build, {r['prebuild']['wall_s']} s. GPU side after the prebuild: **{r['gpu_side_successful_calls']}**"
             f" nvcc calls that built a kernel, {r['gpu_side_nvcc_calls']} in all (a failed build is not cached:"
             " its evaluation compiles it again to judge the error).", "",
             "| | exit | wall s | nvcc calls | nvcc s |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {r[name]['exit']} | {r[name]['wall_s']} | {r[name]['nvcc_calls']} | {r[name]['nvcc_s']} |"
              for name in ("before", "prebuild", "after") if name in r]
    if "tasks" in r.get("before", {}):
        lines += ["", "| task | GPU s before | GPU s after | lane build s before | after | pool build s before | after |",
                  "|---|---|---|---|---|---|---|"]
        for task, b in sorted(r["before"]["tasks"].items()):
            a = r["after"]["tasks"].get(task, {})
            lines.append(f"| {task} | {b['gpu_s']:.1f} | {a.get('gpu_s', 0):.1f} | {b['lane_build_s']:.1f} |"
                         f" {a.get('lane_build_s', 0):.1f} | {b['pool_build_s']:.1f} | {a.get('pool_build_s', 0):.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--select", default=SIX)
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--dry-run", action="store_true", help="No GPU: the GPU side only looks the builds up.")
    parser.add_argument("--prebuilt", type=Path, help="A cache prebuilt on another machine (see above).")
    args = parser.parse_args()
    result = run(args)
    (args.out / "split-build-h200.json").write_text(json.dumps(result, indent=1))
    (args.out / "split-build-h200.md").write_text(text := markdown(result))
    print(text)
    return 0 if result["gpu_side_successful_calls"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
