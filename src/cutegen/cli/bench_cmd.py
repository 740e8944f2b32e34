"""`cutegen bench` (the agent over a suite, or existing candidates judged), `cutegen report` and
`cutegen export`.

Exit statuses of `bench`: 0 the run finished (see RUN/results.json and RUN/bench-report.html),
2 a usage or settings error, 75 waiting for replies and 76 needs a GPU (as `cutegen optimize`: finish
with `cutegen bench` again with the same --run-id, or `cutegen resume RUN` then `cutegen report RUN`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import Progress
from rich.table import Table

from cutegen import bench, export, report
from cutegen.agent import Agent
from cutegen.cli import app
from cutegen.cli import options as opt
from cutegen.cli.common import (
    add_accepted, check_unique, copy_replay_file, executor_config, local_eval_config, log_line, open_library,
    provider_for_run, provider_spec_for_run, running_executor, step_printer, task_end_printer,
)
from cutegen.config import AgentConfig, Budget
from cutegen.errors import ConfigError
from cutegen.journal import JOURNAL, Journal, eval_fingerprint, load_run, new_run_id, start_run
from cutegen.manifest import machine_manifest
from cutegen.records import from_json
from cutegen.report import write_outputs
from cutegen.tasks import load_tasks

console = Console(stderr=True, soft_wrap=True)  # a message is one line in a log, never cut at 80 columns
BENCH_HELP = (
    "Run the agent over a suite (--model), or judge existing ModelNew files (--evaluate DIR), and write"
    " per-task results with KernelBench metrics (results.json) and a report. A run with an existing"
    " --run-id resumes. Exit status: 0 finished, 2 bad settings, 75 waiting for replies, 76 needs a GPU."
)


@app.command("bench", help=BENCH_HELP)
def bench_command(
    suite: Path = typer.Argument(..., help="A KernelBench checkout (level1/...), a folder of task files, or one task."),
    select: str = typer.Option(None, "--select", "-s", help="Task selector, e.g. level1, level2:1-20, '*relu*'."),
    model: str = typer.Option(None, "--model", "-m", help="Run the agent: anthropic:MODEL, openai:MODEL, "
                              "openai-compatible:MODEL@URL, exchange:[DIR] or replay:FILE."),
    evaluate: Path = typer.Option(None, "--evaluate", help="Judge the ModelNew files in this folder instead (one"
                                  " per task: <task stem>.py or level_<L>_problem_<P>_sample_<S>_kernel.py)."),
    rounds: opt.Rounds = 5,
    repairs: opt.Repairs = 3,
    generations: opt.Generations = 3,
    patience: opt.Patience = 3,
    profiling: opt.Profiling = "delayed:2",
    search: opt.Search = "single",
    target_sol: opt.TargetSol = 0.9,
    budget_usd: opt.BudgetUsd = None,
    budget_calls: opt.BudgetCalls = None,
    budget_tokens: opt.BudgetTokens = None,
    budget_gpu_s: opt.BudgetGpuS = None,
    budget_wall_s: opt.BudgetWallS = None,
    max_tokens: opt.MaxTokens = 16384,
    concurrency: opt.Concurrency = 8,
    backend: opt.Backend = "cute",
    device: opt.Device = "cuda",
    track: opt.Track = "fp32",
    correctness_trials: opt.CorrectnessTrials = 5,
    timing_trials: opt.TimingTrials = 100,
    compile_baseline: opt.CompileBaseline = True,
    gpus: str = typer.Option(None, "--gpus", help="GPU indices to use, e.g. 0,1 (default: every visible GPU)."),
    build_jobs: int = typer.Option(None, "--build-jobs", "--prebuild-jobs", help="Candidate builds at once on the"
                                   " CPU cores, beside the GPU evaluations (default: the cores the GPU lanes"
                                   " leave)."),
    executor: opt.ExecutorSpec = "local",
    ray_resource: opt.RayResource = None,
    runs_dir: opt.RunsDir = Path("runs"),
    run_id: str = typer.Option(None, "--run-id", help="Run directory name; an existing one is resumed."),
    html: bool = typer.Option(True, "--report/--no-report", help="Write bench-report.md/.html at the end."),
    library: opt.LibraryPath = None,
    no_library: opt.NoLibrary = False,
    library_examples: opt.LibraryExamples = 2,
    library_same_task: opt.LibrarySameTask = False,
) -> None:
    if (model is None) == (evaluate is None):
        raise ConfigError("cutegen bench needs exactly one of --model (run the agent over the suite) and"
                          " --evaluate DIR (judge existing candidate files).",
                          "Add --model PROVIDER:MODEL, or --evaluate with the folder of ModelNew files.")
    tasks = load_tasks(suite, select)
    where = executor_config(executor, ray_resource)
    eval_config = _eval_config(track=track, backend=backend, device=device, correctness_trials=correctness_trials,
                               timing_trials=timing_trials, compile_baseline=compile_baseline,
                               gpus=_gpu_list(gpus, device))
    store = open_library(library, no_library, device=device, gpu=eval_config.gpus[0])  # unusable: fails here
    if evaluate is not None:
        if build_jobs is not None and build_jobs < 1:
            raise ConfigError(f"--build-jobs {build_jobs} is below 1.", "Give --build-jobs 1 or more.")
        status, run_dir = _bench_evaluate(suite, select, tasks, evaluate, eval_config, runs_dir, run_id, build_jobs,
                                          where, store)
    else:
        budget = Budget(llm_calls=budget_calls, tokens=budget_tokens, usd=budget_usd, gpu_s=budget_gpu_s,
                        wall_s=budget_wall_s)
        agent_config = AgentConfig(rounds=rounds, repairs=repairs, generations=generations, patience=patience,
                                   profiling=profiling, target_sol_fraction=target_sol, max_tokens=max_tokens,
                                   concurrency=concurrency, budget=budget, search=search, library=not no_library,
                                   library_examples=library_examples, library_same_task=library_same_task)
        status, run_dir = _bench_agent(suite, select, tasks, model, agent_config, eval_config, runs_dir, run_id,
                                       where, store)
    if html:
        _write_report(run_dir)
    sys.exit(status)  # sys.exit, not typer.Exit: click returns an Exit's code outside standalone mode


# ------------------------------------------------------------------------------ the agent over a suite


def _bench_agent(suite: Path, select: str | None, tasks: list, model: str, agent_config: Any, eval_config: Any,
                 runs_dir: Path, run_id: str | None, where: Any, library: Any = None) -> tuple[int, Path]:
    check_unique(tasks)
    run_dir = runs_dir / (run_id or new_run_id())
    if (run_dir / JOURNAL).is_file():
        journal = Journal.open(run_dir)
        setup = load_run(journal)
        _check_same_tasks(run_dir, setup.tasks, tasks)
        agent_config = from_json(type(agent_config), setup.agent)  # a resumed run keeps its settings
        eval_config = _eval_config(**{**setup.evaluation, "gpus": eval_config.gpus})
        console.print(f"resuming {run_dir} with its recorded settings")
    else:
        provider_for_run(model, None)  # a missing key or file fails here, before the run directory exists
        journal = Journal.create(run_dir)
        copy_replay_file(model, run_dir)
        start_run(journal, tasks, provider_spec_for_run(model), agent_config, eval_config)
        bench.write_meta(run_dir, kind="agent", suite=suite, select=select, tasks=tasks, config=eval_config)
        console.print(f"run directory: {run_dir}")
    bench.add_session(run_dir, machine_manifest(eval_config.runtime))
    status = _run_agent(journal, agent_config, eval_config, where, library)
    setup = load_run(journal)
    bench.write_results(run_dir, bench.agent_results(run_dir), kind="agent", model=setup.model,
                        recorded=bench.load_run(run_dir).recorded, agent=setup.agent, evaluation=setup.evaluation)
    _print_summary(run_dir)
    return status, run_dir


def _check_same_tasks(run_dir: Path, recorded: tuple, selected: list) -> None:
    if {(t.task_id, t.source_sha256) for t in recorded} != {(t.task_id, t.source_sha256) for t in selected}:
        raise ConfigError(f"Run {run_dir} was started on another task set than the suite and --select given now.",
                          "Resume it with the suite and --select it was started with (or `cutegen resume RUN`),"
                          " or pick a new --run-id.")


def _run_agent(journal: Any, agent_config: Any, eval_config: Any, where: Any, library: Any = None) -> int:
    """The agent over every task of the run (as `cutegen optimize`), with suite-wide progress."""

    setup = load_run(journal)
    provider = provider_for_run(setup.model, journal.run_dir.resolve())
    ids = [t.task_id for t in setup.tasks]
    progress = bench.SuiteProgress(ids, already_done=[i for i in ids if journal.task_end(i) is not None])
    logging = not sys.stdout.isatty()  # a log gets one plain line per event; a terminal a live table
    live_table = contextlib.nullcontext() if logging else \
        Live(_progress_table(progress), console=console, refresh_per_second=2, transient=False)
    with running_executor(where, eval_config) as executor, live_table as live:
        ended = task_end_printer() if logging else None

        def on_progress(result: Any, activity: str) -> None:
            progress.update(result, activity)
            if ended is not None:
                ended(result)
            else:
                live.update(_progress_table(progress))

        agent = Agent(journal, provider, agent_config, eval_config, executor=executor, on_progress=on_progress,
                      on_step=step_printer() if logging else None, library=library)
        journal.begin_session(host=platform.node(), argv=sys.argv[1:])
        status = asyncio.run(agent.run(list(setup.tasks)))
        if logging:
            log_line(_progress_title(progress))
        else:
            live.update(_progress_table(progress))  # the final state
    results = [agent.result(t.task_id) for t in setup.tasks]
    write_outputs(journal, results)
    journal.append("exit", status=status, pending=[r.task_id for r in results if r.status != "done"])
    return status


def _progress_title(progress: Any) -> str:
    snap = progress.snapshot()
    eta = _duration(snap.eta_s) if snap.eta_s is not None else "-"
    return (f"cutegen bench: {snap.done}/{snap.total} done, {snap.running} running, {snap.queued} queued;"
            f" {snap.correct} correct; ${snap.cost_usd:.2f}; GPU {snap.gpu_s:.0f} s;"
            f" elapsed {_duration(snap.elapsed_s)}, ETA {eta}")


def _progress_table(progress: Any) -> Table:
    table = Table(title=_progress_title(progress), title_justify="left")
    for column in ("task", "stage", "steps", "best vs eager", "calls", "cost $"):
        table.add_column(column, justify="left" if column in ("task", "stage") else "right")
    active = [(r, a) for r, a in progress.state.values() if r.status != "done" and a != "queued"]
    for result, activity in active[:12]:
        speedup = f"{result.speedup_vs_eager:.3g}x" if result.speedup_vs_eager is not None else "-"
        table.add_row(result.task_id, activity, str(result.steps), speedup, str(result.llm_calls),
                      f"{result.cost_usd:.4f}")
    return table


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


# ------------------------------------------------------------------------------ --evaluate


def _bench_evaluate(suite: Path, select: str | None, tasks: list, folder: Path, config: Any, runs_dir: Path,
                    run_id: str | None, build_jobs: int | None, where: Any, library: Any = None) -> tuple[int, Path]:
    out = runs_dir / (run_id or f"{new_run_id()}-evaluate")
    found, unmatched = bench.find_candidates(tasks, folder)
    if not (out / bench.BENCH_META).is_file():
        out.mkdir(parents=True, exist_ok=True)
        bench.write_meta(out, kind="evaluate", suite=suite, select=select, tasks=tasks, config=config, candidates=folder)
    for path in unmatched:
        console.print(f"[yellow]not a candidate of any selected task (skipped):[/] {path}")
    console.print(f"{len(found)} candidate file(s) for {len({k[0] for k in found})} of {len(tasks)} task(s); results in {out}")
    bench.add_session(out, machine_manifest(config.runtime))
    logging = not sys.stdout.isatty()  # a log gets one line per verdict; a terminal a progress bar
    by_id, signatures, added = {t.task_id: t for t in tasks}, {}, []  # the accepted kernels join the library
    with running_executor(where, config, build_jobs) as executor, \
            Progress(console=console, transient=True, disable=logging) as bar:
        job = bar.add_task("judging", total=len(found))

        def on_result(result: Any, finished: int, total: int, verdict: Any = None) -> None:
            mark = "correct" if result.correctness else f"{result.stage_reached}: {result.failure}"
            bar.update(job, completed=finished, description=f"judged {result.task_id} sample {result.sample_id}: {mark}")
            if library is not None and verdict is not None and verdict.passed:
                added.append(add_accepted(library, by_id[result.task_id], out / result.candidate_path, verdict,
                                          "bench --evaluate", out.name, signatures)[0])
            if logging:
                log_line(f"[{finished}/{total}] " + bench.step_line(result.task_id, f"sample {result.sample_id}",
                                                                   verdict, result.failure))

        def on_waiting(running: list[tuple[str, Any, float]]) -> None:
            if logging and running:
                shown = ", ".join(f"{task} sample {sample} ({seconds:.0f} s)" for task, sample, seconds in running[:3])
                more = f" and {len(running) - 3} more" if len(running) > 3 else ""
                log_line(f"still judging {len(running)} candidate(s): {shown}{more}")

        results = bench.evaluate_suite(tasks, folder, out, config, on_result=on_result, executor=executor,
                                       on_waiting=on_waiting)
    bench.write_results(out, results, kind="evaluate", evaluation=eval_fingerprint(config))
    if library is not None:
        console.print(f"kernel library {library.path}: {sum(i is not None for i in added)} of {len(added)} accepted"
                      " kernel(s) added (the rest were there)")
    _print_summary(out)
    _print_throughput(out)
    return 0, out


def _print_throughput(out: Path) -> None:
    path = out / bench.THROUGHPUT
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    built, first = data["built"], data["first"]
    typer.echo(f"throughput: {data['evaluations']} evaluations in {data['wall_s']:.0f} s ="
               f" {data['per_gpu_minute']} per GPU-minute (builds included); GPU s per evaluation of a built"
               f" candidate: median {built['median_gpu_s']}, p90 {built['p90_gpu_s']}; a task's first:"
               f" median {first['median_gpu_s']}" + (f"; {data['retries']} sent again after their node or process died"
                                                    if data.get("retries") else "") + f" ({path})")


# ------------------------------------------------------------------------------ shared helpers


def _eval_config(**fields: Any) -> Any:
    if "gpus" in fields:
        fields["gpus"] = list(fields["gpus"])
    return local_eval_config(**fields)


def _gpu_list(text: str | None, device: str) -> tuple[int, ...]:
    """--gpus, else every visible GPU: the indices of CUDA_VISIBLE_DEVICES when it lists numbers (a
    worker is pinned by setting it to one of them), else 0..count-1."""

    if text:
        try:
            return tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise ConfigError(f"--gpus {text!r} is not a list of GPU indices.", "Write e.g. --gpus 0,1.") from None
    if device != "cuda":
        return (0,)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible and all(part.strip().isdigit() for part in visible.split(",")):
        return tuple(int(part) for part in visible.split(","))
    import torch  # lazy: loading torch takes seconds

    return tuple(range(torch.cuda.device_count())) or (0,)


def _write_report(run_dir: Path) -> None:
    if importlib.util.find_spec("matplotlib") is None:  # the report's plots need it; the results do not
        console.print("[yellow]matplotlib is not installed: no report written[/] (results.json is complete);"
                      f" run `cutegen report {run_dir}` where it is.")
        return

    md, html = report.write_report([bench.load_run(run_dir)], run_dir)
    typer.echo(f"report: {html}")
    typer.echo(f"report: {md}")


def _print_summary(run_dir: Path) -> None:
    run = bench.load_run(run_dir)
    if not sys.stdout.isatty():  # a log: one plain line per group, no box to wrap
        for g in run.summary:
            typer.echo(f"{run.run_id} {g.group}: {g.tasks} tasks, {g.correct} correct; vs eager fast_1"
                       f" {_pct(g.fast_1_eager)}, fast_2 {_pct(g.fast_2_eager)}, geomean {_x(g.geomean_speedup_eager)};"
                       f" vs torch.compile fast_1 {_pct(g.fast_1_compile)}, geomean {_x(g.geomean_speedup_compile)}")
        typer.echo(f"results: {run_dir / bench.RESULTS}")
        return
    table = Table(title=f"{run.run_id}: {len(run.results)} result(s)", title_justify="left")
    for column in ("group", "tasks", "correct", "fast_1", "fast_2", "geomean", "fast_1 (compile)", "geomean (compile)"):
        table.add_column(column, justify="left" if column == "group" else "right")
    for g in run.summary:
        table.add_row(g.group, str(g.tasks), str(g.correct), _pct(g.fast_1_eager), _pct(g.fast_2_eager),
                      _x(g.geomean_speedup_eager), _pct(g.fast_1_compile), _x(g.geomean_speedup_compile))
    Console().print(table)
    typer.echo(f"results: {run_dir / bench.RESULTS}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


# ------------------------------------------------------------------------------ report, export


@app.command("report", help="Markdown and a self-contained HTML page with plots for one run, or several side by"
                            " side (e.g. profiling none / immediate / delayed).")
def report_command(
    runs: list[Path] = typer.Argument(..., help="Run directories (cutegen bench, optimize or bench --evaluate)."),
    out: Path = typer.Option(None, "--out", "-o", help="Folder for bench-report.md/.html and plots/ (default:"
                             " the run directory for one run, ./bench-report for several)."),
) -> None:
    loaded = [bench.load_run(run) for run in runs]
    target = out or (runs[0] if len(runs) == 1 else Path("bench-report"))
    md, html = report.write_report(loaded, target)
    typer.echo(f"report: {html}")
    typer.echo(f"report: {md}")


@app.command("export", help="Write a task's best kernel as a standalone KernelBench ModelNew file, or as a"
                            " registered torch custom op that torch.compile(fullgraph=True) can call.")
def export_command(
    run: Path = typer.Argument(..., help="A run directory (cutegen bench, optimize or bench --evaluate)."),
    task: str = typer.Argument(..., help="The task: its id (level1/19) or file stem (19_ReLU, swish_scale)."),
    fmt: str = typer.Option("kernelbench", "--format", "-f", help="kernelbench or torch-op."),
    out: Path = typer.Option(None, "--out", "-o", help="The file to write (default: a KernelBench-style name"
                             " in the current folder)."),
    force: bool = typer.Option(False, "--force", help="Overwrite the file if it exists."),
) -> None:
    text, name = export.export_best(run, task, fmt)
    target = out or Path(name)
    if target.exists() and not force:
        raise ConfigError(f"{target} exists (a task file of the same name, or an earlier export).",
                          "Pass --out with another path, or --force to overwrite it.")
    target.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {target}")
