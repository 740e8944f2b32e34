"""`cutegen prebuild`: build every candidate's kernels on a machine without a GPU, for a GPU machine to find.

A split run builds on the CPU side and measures on the GPU side. The build cache key is content only
(runtime/build.py: source, flags without the include folder, arch, nvcc version, the CUTLASS headers'
id), so the GPU side finds these builds in the same cache folder (CUTEGEN_CACHE, copied or shared)
whatever path its toolkit and headers are installed at, and runs no nvcc for them.

Exit status: 0 every candidate was looked at (a build that fails is listed: the evaluation builds it
again and judges the error), 2 a usage or settings error (no architecture, nvcc or headers missing).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from cutegen.cli import app, env
from cutegen.cli.common import local_eval_config
from cutegen.errors import ConfigError
from cutegen.evaluate.pipeline import prebuild_candidates
from cutegen.journal import JOURNAL, Journal, load_run
from cutegen.runtime import find_cutlass_include, find_nvcc, normalize_arch

PREBUILD_HELP = (
    "Build the CuTe kernels of every candidate of a run (its candidates/ folder) or of a folder of ModelNew"
    " files, without a GPU, into the build cache (CUTEGEN_CACHE). A GPU machine with the same nvcc and"
    " CUTLASS release then finds them, wherever those are installed. Exit status: 0 done (failed builds"
    " are listed), 2 bad settings."
)


@app.command("prebuild", help=PREBUILD_HELP)
def prebuild_command(
    target: Path = typer.Argument(..., help="A run directory (cutegen optimize/bench), a folder of candidate"
                                  " files, or one candidate file."),
    arch: str = typer.Option(None, "--arch", help="The GPU architecture to build for, e.g. sm_90a (H100/H200);"
                             " default CUTEGEN_ARCH."),
    jobs: int = typer.Option(2, "--jobs", "-j", help="Builds at once (each in its own CPU worker)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of lines."),
) -> None:
    runtime = env.runtime_config()
    chosen = arch or runtime.arch
    if not chosen:
        raise ConfigError("cutegen prebuild needs the architecture to build for: a machine without a GPU cannot"
                          " read it off a device.", "Pass --arch sm_90a (H100/H200), or set CUTEGEN_ARCH.")
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs} is below 1.", "Give --jobs 1 or more.")
    runtime = replace(runtime, arch=normalize_arch(chosen))
    find_nvcc(runtime), find_cutlass_include(runtime)  # one clear error now, not one per candidate
    config, paths = _candidates(target, runtime)
    started = time.perf_counter()
    rows = prebuild_candidates(paths, config, jobs=jobs) if paths else []
    summary = _summary(rows, runtime, time.perf_counter() - started)
    if as_json:
        typer.echo(json.dumps({"target": str(target), **summary, "results": rows}, indent=1))
    else:
        for row in rows:
            typer.echo(_line(row))
        typer.echo(f"prebuild: {summary['candidates']} candidate(s), {summary['kernels_built']} kernel(s) built,"
                   f" {summary['kernels_cached']} found in the cache, {summary['failed']} failed, in"
                   f" {summary['wall_s']:.1f} s for {summary['arch']}; builds in {summary['build_cache']}")
    sys.exit(0)


def _candidates(target: Path, runtime: Any) -> tuple[Any, list[Path]]:
    """The evaluation settings to build with (a run's own, with this machine's toolchain) and the files."""

    if (target / JOURNAL).is_file():
        setup = load_run(Journal.open(target))
        config = local_eval_config(**setup.evaluation)
        paths = sorted((target / "candidates").glob("*.py"))
    elif target.is_dir():
        config, paths = local_eval_config(backend="cute", device="cuda"), sorted(target.glob("*.py"))
    elif target.is_file():
        config, paths = local_eval_config(backend="cute", device="cuda"), [target]
    else:
        raise ConfigError(f"{target} is neither a run directory, a folder nor a file.",
                          "Pass the folder `cutegen optimize` printed, or a folder of ModelNew files.")
    return replace(config, runtime=runtime), paths


def _summary(rows: list[dict[str, Any]], runtime: Any, wall_s: float) -> dict[str, Any]:
    kernels = [k for row in rows for k in row["kernels"]]
    return {"arch": runtime.arch, "build_cache": str(runtime.cache_dir), "candidates": len(rows),
            "failed": sum(not row["ok"] for row in rows), "kernels_built": sum(not k["cached"] for k in kernels),
            "kernels_cached": sum(bool(k["cached"]) for k in kernels),
            "nvcc_s": round(sum(k["compile_s"] or 0.0 for k in kernels), 2), "wall_s": round(wall_s, 2)}


def _line(row: dict[str, Any]) -> str:
    name = Path(row["path"]).name
    if not row["ok"]:
        first = (row["error"] or "").strip().splitlines()[:1]
        return f"failed {name}: {first[0] if first else 'no message'}"
    if row.get("skipped"):
        return f"nothing to build {name}: {row['skipped']}"
    if not row["kernels"]:  # a kernel made later (in forward) is built by the evaluation
        return f"nothing to build {name}: no CuTe kernel made at import"
    parts = [f"{k['name']} " + ("cached" if k["cached"] else f"built in {k['compile_s'] or 0.0:.1f} s")
             for k in row["kernels"]]
    return f"ok {name}: " + ", ".join(parts)
