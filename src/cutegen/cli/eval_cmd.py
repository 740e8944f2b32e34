"""`cutegen eval` (judge one candidate) and `cutegen baseline` (time eager and torch.compile).

Exit status of `eval`: 0 the candidate passed, 1 it was rejected (the table says by which check),
2 a usage or settings error, 3 the GPU was too busy to judge it (gpu_busy), 76 needs a GPU (on a
machine without a CUDA device the candidate passed the static checks and, where nvcc and CUTEGEN_ARCH
allow, the build; the rest needs the device). With --json stdout holds one JSON object on every exit:
the Verdict, or {"exit_status", "reason", "message"} when there is none (needs_gpu, usage_error).
`baseline`: 0 every task measured, 1 some failed, 2 a usage error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.progress import Progress
from rich.table import Table

from cutegen.agent import EXIT_NEEDS_GPU  # as `cutegen optimize` exits: what can be judged here passed
from cutegen.cli import app, env
from cutegen.cli import options as opt
from cutegen.cli.common import add_accepted, one_task, open_library
from cutegen.config import EvalConfig
from cutegen.errors import TaskError
from cutegen.evaluate.baselines import BaselineWorker, get_baselines
from cutegen.evaluate.executor import device_available
from cutegen.evaluate.pipeline import NeedsDevice, evaluate_candidate
from cutegen.evaluate.worker import WorkerPool
from cutegen.records import to_json
from cutegen.tasks import load_tasks

EXIT_REJECTED = 1
EXIT_INFRASTRUCTURE = 3  # not a verdict: the GPU was shared and the evaluation could not finish (gpu_busy)
stderr = Console(stderr=True)


def _eval_config(**fields: Any) -> Any:
    return EvalConfig(cache_dir=env.cache_root() / "eval", runtime=env.runtime_config(), **fields)


@app.command("eval")
def eval_command(
    candidate: Path = typer.Argument(..., help="Python file defining class ModelNew(nn.Module)."),
    task: Path = typer.Option(..., "--task", "-t", help="The task file (or a suite with --select)."),
    select: str = typer.Option(None, "--select", "-s", help="One task of a suite, e.g. level1/19."),
    as_json: bool = typer.Option(False, "--json", help="Print the Verdict as JSON."),
    track: opt.Track = "fp32",
    backend: opt.Backend = "cute",
    device: opt.Device = "cuda",
    no_timing: bool = typer.Option(False, "--no-timing", help="Stop after correctness and anti-cheat checks."),
    compile_baseline: opt.CompileBaseline = True,
    timing_trials: opt.TimingTrials = 100,
    gpu: int = typer.Option(0, "--gpu", help="GPU index to run on."),
    library: opt.LibraryPath = None,
    no_library: opt.NoLibrary = False,
) -> None:
    """Judge one candidate with the hardened evaluator (a passing one joins the kernel library). Exit
    status: 0 passed, 1 rejected, 2 usage error, 76 needs a GPU (no CUDA device here: the static checks,
    and the build where it can run, passed)."""

    config = _eval_config(track=track, backend=backend, device=device, do_timing=not no_timing,
                          compile_baseline=compile_baseline, timing_trials=timing_trials, gpus=(gpu,))
    chosen = one_task(task, select)

    store = open_library(library, no_library, device=device, gpu=gpu)  # an unusable file fails before the work
    try:
        with stderr.status(f"evaluating {candidate.name} on {chosen.task_id}", spinner="dots"):
            verdict = evaluate_candidate(candidate, chosen, config, device_available=device_available(config))
    except NeedsDevice:
        arch = config.runtime.arch
        built = f" and the build for {arch}" if arch else " (set CUTEGEN_ARCH, e.g. sm_90a, to build here too)"
        message = (f"{candidate.name} passed the static checks of backend {config.backend}{built}; the rest of the"
                   " evaluation needs a CUDA device: run `cutegen eval` again on a machine with one.")
        if as_json:  # no verdict: the exit and its reason, so that a script reading stdout gets an object
            typer.echo(json.dumps({"exit_status": EXIT_NEEDS_GPU, "reason": "needs_gpu", "message": message,
                                   "task_id": chosen.task_id, "candidate": str(candidate)}))
        stderr.print(f"[yellow]needs a GPU:[/] {message}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_NEEDS_GPU)
    if store is not None and verdict.passed:
        stderr.print(add_accepted(store, chosen, candidate, verdict, "eval")[1], highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(json.dumps(to_json(verdict), indent=1))
    else:
        print_verdict(verdict, Console())
    # sys.exit (not typer.Exit): the exit status is the verdict, whichever way main() is entered.
    sys.exit(0 if verdict.passed else EXIT_INFRASTRUCTURE if verdict.infrastructure else EXIT_REJECTED)


def _ms(stats: Any) -> str:
    return f"{stats.median_ms:.4g}" if stats is not None else "-"


def print_verdict(verdict: Any, console: Console) -> None:
    """Checks by stage, errors, times against both baselines, the work bound, then the feedback."""
    status = "[bold green]PASSED[/]" if verdict.passed else f"[bold red]REJECTED[/] ({verdict.failure})"
    console.print(f"{verdict.task_id}  candidate {verdict.candidate_sha256[:12]}  track {verdict.track}"
                  f"  backend {verdict.backend}: {status}")
    checks = Table(title="checks", show_lines=False)
    for column in ("stage", "check", "result", "detail"):
        checks.add_column(column, overflow="fold")
    for check in verdict.checks:
        mark = "[green]ok[/]" if check.passed else "[red]FAIL[/]"
        checks.add_row(check.stage, check.name, mark, check.detail.splitlines()[0][:160] if check.detail else "")
    console.print(checks)
    if verdict.errors is not None:
        e = verdict.errors
        console.print(f"errors: max abs {e.max_abs_error:.3g}, max rel {e.max_rel_error:.3g}, rel L2"
                      f" {e.rel_l2_error:.3g}; {e.mismatched_elements}/{e.total_elements} outside atol"
                      f" {e.atol:g} + rtol {e.rtol:g}")
    if verdict.timing is not None:
        console.print(_timing_table(verdict))
    if verdict.degenerate:
        console.print(f"[yellow]task flagged degenerate[/]: {', '.join(verdict.degenerate)} pass its check")
    console.print(Panel(verdict.feedback or "-", title="feedback", expand=False))


def _timing_table(verdict: Any) -> Table:
    table = Table(title="timing (ms)")
    for column in ("", "median", "IQR", "min", "speedup"):
        table.add_column(column, justify="right")
    rows = (("candidate", verdict.timing, None), ("eager", verdict.eager, verdict.speedup_vs_eager),
            ("torch.compile", verdict.compiled, verdict.speedup_vs_compile))
    for name, stats, speedup in rows:
        if stats is not None:
            table.add_row(name, _ms(stats), f"{stats.iqr_ms:.3g}", f"{stats.min_ms:.4g}",
                          f"{speedup:.2f}x" if speedup is not None else "")
    caption = []
    if verdict.sol_fraction is not None:
        caption.append(f"{verdict.sol_fraction * 100:.1f}% of the reference algorithm's work bound ({verdict.sol_bound_ms:.4g} ms)")
    if verdict.noise_pct is not None:
        caption.append(f"baseline noise {verdict.noise_pct:.1f}%")
    table.caption = "; ".join(caption) or None
    return table


@app.command("baseline")
def baseline_command(
    suite: Path = typer.Argument(..., help="A task file, a folder of task files, or a KernelBench checkout."),
    select: str = typer.Option(None, "--select", "-s", help="e.g. level1, level2:1-20, level1/19."),
    track: opt.TrackBrief = "fp32",
    device: str = typer.Option("cuda", "--device", help="cuda or cpu."),
    compile_baseline: bool = typer.Option(True, "--compile-baseline/--no-compile-baseline",
                                          help="Also time torch.compile."),
    timing_trials: opt.TimingTrials = 100,
    gpu: int = typer.Option(0, "--gpu", help="GPU index to run on."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Measure and cache eager and torch.compile times (resumable: cached tasks are not re-measured)."""

    config = _eval_config(track=track, device=device, backend="torch" if device == "cpu" else "cute",
                          compile_baseline=compile_baseline, timing_trials=timing_trials, gpus=(gpu,))
    tasks = load_tasks(suite, select)
    rows: list[tuple[Any, Any, str | None]] = []
    # One worker measures task after task (it never sees a candidate); no kernel audit needs its profiler.
    with WorkerPool.for_config(config, warm_profiler=False, warm_compile=compile_baseline) as pool, \
            BaselineWorker(pool) as held, Progress(console=stderr, transient=True) as progress:
        for task in progress.track(tasks, description="baselines"):
            try:
                rows.append((task, get_baselines(task, config, pool, held), None))
            except TaskError as err:  # one broken task must not stop the suite
                rows.append((task, None, err.problem))
    if as_json:
        typer.echo(json.dumps([{"task_id": t.task_id, "baselines": to_json(b), "error": e} for t, b, e in rows],
                              indent=1))
    else:
        _print_baselines(rows)
    sys.exit(EXIT_REJECTED if any(e for _, _, e in rows) else 0)


def _print_baselines(rows: list[tuple[Any, Any, str | None]]) -> None:
    table = Table(title="baselines (median ms)")
    for column in ("task", "eager", "noise %", "torch.compile", "compile speedup", "note"):
        table.add_column(column, justify="left" if column in ("task", "note") else "right")
    for task, b, error in rows:
        if b is None:
            table.add_row(task.task_id, "", "", "", "", f"[red]{(error or '')[:80]}[/]")
            continue
        ratio = b.eager.median_ms / b.compiled.median_ms if b.eager and b.compiled else None
        table.add_row(task.task_id, _ms(b.eager), f"{b.noise_pct:.1f}" if b.noise_pct is not None else "-",
                      _ms(b.compiled), f"{ratio:.2f}x" if ratio else "-", (b.compile_error or "")[:60])
    Console().print(table)
