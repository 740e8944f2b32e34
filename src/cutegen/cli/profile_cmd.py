"""`cutegen profile`: Nsight Compute on one forward of a candidate, summarised for a person or a model.

Exit status: 0 a profile was made, 1 no profile could be made (ncu missing, no permission to read the
GPU counters, a timeout, a failing candidate; the message says which and what to do), 2 a usage or
settings error.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console

from cutegen.cli import app, env
from cutegen.cli.common import one_task
from cutegen.config import EvalConfig, ProfileConfig
from cutegen.evaluate.pipeline import read_candidate
from cutegen.profile import ProfileUnavailable, collect, interpret, profile_text
from cutegen.records import to_json

EXIT_UNAVAILABLE = 1
stderr = Console(stderr=True)


@app.command("profile")
def profile_command(
    candidate: Path = typer.Argument(..., help="Python file defining class ModelNew(nn.Module)."),
    task: Path = typer.Option(..., "--task", "-t", help="The task file (or a suite with --select)."),
    select: str = typer.Option(None, "--select", "-s", help="One task of a suite, e.g. level1/19."),
    as_json: bool = typer.Option(False, "--json", help="Print the Profile record and its summary as JSON."),
    track: str = typer.Option("fp32", "--track", help="Precision track (TF32 flags; the speed-of-light peak)."),
    gpu: int = typer.Option(0, "--gpu", help="GPU index to profile on."),
    timeout: float = typer.Option(180.0, "--timeout", help="Seconds for the whole profiled run."),
    ncu: str = typer.Option(None, "--ncu", help="The ncu binary (default: PATH, then /usr/local/cuda/bin)."),
    keep: Path = typer.Option(None, "--keep", help="Also save ncu's report (profile.ncu-rep) and its raw CSV here."),
) -> None:
    """Profile one forward of a candidate with Nsight Compute. Exit status: 0 profiled, 1 no profile, 2 usage error."""

    config = ProfileConfig(ncu=ncu or env.profile_config().ncu, timeout_s=timeout)
    eval_config = EvalConfig(track=track, cache_dir=env.cache_root() / "eval", runtime=env.runtime_config(),
                             gpus=(gpu,))
    chosen = one_task(task, select)
    source = read_candidate(candidate)
    started = time.perf_counter()
    try:
        with stderr.status(f"profiling {candidate.name} on {chosen.task_id}", spinner="dots"):
            collected = collect(source, chosen, config, eval_config, keep_report=keep is not None)
            profile = interpret(collected, source, chosen, config, eval_config, wall_s=time.perf_counter() - started)
    except ProfileUnavailable as err:
        if as_json:
            typer.echo(json.dumps({"profile": None, "unavailable": {"reason": err.reason, "message": str(err)}}))
        stderr.print(f"[bold yellow]no profile[/] ({err.reason}): {err}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_UNAVAILABLE)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "ncu-raw.csv").write_text(collected.csv_text, encoding="utf-8")
        if collected.report is not None:
            (keep / "profile.ncu-rep").write_bytes(collected.report)
    text = profile_text(profile)
    if as_json:
        typer.echo(json.dumps({"profile": to_json(profile), "summary": text}, indent=1))
    else:
        typer.echo(text)
        stderr.print(f"profiled in {profile.wall_s:.1f} s with {profile.tool}", highlight=False)
    sys.exit(0)
