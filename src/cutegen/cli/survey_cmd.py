"""`cutegen survey`: the baselines, speed-of-light bounds and trivial-solution flags of a whole suite on
this machine, in one file that later calls resume (cutegen.survey)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import typer

from cutegen import survey
from cutegen.cli import app, env
from cutegen.cli import options as opt
from cutegen.config import EvalConfig
from cutegen.errors import ConfigError
from cutegen.manifest import machine_manifest
from cutegen.tasks import load_tasks

SURVEY_HELP = (
    "Measure a suite on this machine: eager and torch.compile baselines of each precision track (one task"
    " at a time, nothing else on the device), the speed-of-light bound and the fraction of it each reaches,"
    " and the trivial-solution flags of every task. Writes OUT (JSON) and OUT with .md after every entry;"
    " a later call with the same OUT (or --state) measures only what is missing. Exit status: 0 done or"
    " out of budget (the summary says what is left), 2 bad settings."
)

NO_LIMIT_S = 1e9  # a budget no survey reaches (finite: the loop divides what is left by its estimate)


@app.command("survey", help=SURVEY_HELP)
def survey_command(
    suite: Path = typer.Argument(..., help="A KernelBench checkout, a folder of task files, or one task."),
    out: Path = typer.Option(..., "--out", help="The survey file (JSON) to write; its .md table goes beside it."),
    select: str = typer.Option(None, "--select", "-s", help="e.g. level1,level2 or level1:1-16."),
    state: str = typer.Option(None, "--state", help="An earlier survey file to resume from, beside OUT"
                              " itself (which a killed run left); default none."),
    tracks: str = typer.Option("fp32,tf32", "--tracks", help="Precision tracks to measure: fp32, tf32 or both."),
    budget_s: float = typer.Option(None, "--budget-s", help="Seconds: start no (task, track) that would not end"
                                   " within them (default: no limit)."),
    compile_jobs: int = typer.Option(max(1, (os.cpu_count() or 2) - 2), "--compile-jobs",
                                     help="Workers precompiling torch.compile in parallel (0: none)."),
    chunk: int = typer.Option(None, "--chunk", help="(task, track)s per precompile chunk (default: twice"
                              " --compile-jobs)."),
    work: Path = typer.Option(Path(tempfile.gettempdir()) / "cutegen-survey", "--work",
                              help="Holds the inductor and triton caches the precompile fills."),
    device: opt.Device = "cuda",
    gpu: int = typer.Option(0, "--gpu", help="GPU index to run on."),
    timing_trials: opt.TimingTrials = 100,
    compile_baseline: opt.CompileBaseline = True,
    probe: bool = typer.Option(True, "--probe/--no-probe", help="Run each task's trivial-solution probe."),
    retry_errors: bool = typer.Option(False, "--retry-errors", help="Measure again what recorded an error."),
    report_only: bool = typer.Option(False, "--report-only", help="Measure nothing: write the table again from"
                                     " the files read (no GPU needed)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object (progress on stderr)."),
) -> None:
    wanted = survey.Wanted(tracks=_tracks(tracks), compile_baseline=compile_baseline, probe=probe,
                           retry_errors=retry_errors)
    inductor = _compile_caches(work, device)
    evaluation = EvalConfig(device=device, backend="cute" if device == "cuda" else "torch", gpus=(gpu,),
                            timing_trials=timing_trials, compile_baseline=compile_baseline,
                            cache_dir=env.cache_root() / "eval", runtime=env.runtime_config())
    budget_s = budget_s if budget_s is not None else NO_LIMIT_S
    settings = {"select": select, "tracks": list(wanted.tracks), "budget_s": budget_s, "compile": compile_baseline,
                "compile_jobs": compile_jobs, "chunk": chunk or max(2, 2 * compile_jobs), "timing_trials": timing_trials}
    earlier = None if (state or "").lower() in ("", "none") else Path(state)
    if earlier is not None and not earlier.is_file():  # a mistyped path would measure everything again
        raise ConfigError(f"--state {state} is not a file.", "Give an earlier survey file, or leave --state out.")
    config = survey.SurveyConfig(out=out, evaluation=evaluation, inductor_dir=inductor, wanted=wanted, state=earlier,
                                 budget_s=budget_s, compile_jobs=compile_jobs, chunk=settings["chunk"],
                                 settings=settings)
    log = (lambda line: typer.echo(line, err=True)) if as_json else typer.echo
    summary = survey.run_survey(config, load_tasks(suite, select), suite, machine_manifest(evaluation.runtime),
                                log=log, measure=not report_only)
    if as_json:
        typer.echo(json.dumps({"out": str(out), "summary": summary}, indent=1, default=str))
    sys.exit(0)


def _tracks(value: str) -> tuple[str, ...]:
    tracks = tuple(t.strip() for t in value.split(",") if t.strip())
    if not tracks or not set(tracks) <= {"fp32", "tf32"}:
        raise ConfigError(f"--tracks {value!r} names no precision track cutegen knows.", "Give fp32, tf32 or fp32,tf32.")
    return tracks


def _compile_caches(work: Path, device: str) -> Path:
    """Point torch.compile's caches at `work` before any worker starts (every worker, precompile and
    measurement, compiles into them), one compile thread per worker; the inductor folder."""
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(work / "triton"))
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if device == "cpu":
        # Inductor keeps the C++ precompiled headers of CPU kernels in the temp folder, which is fresh in
        # every worker: it rebuilt them (~7 s) at each compile even on a cache hit.
        os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])

