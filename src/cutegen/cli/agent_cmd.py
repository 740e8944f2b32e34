"""`cutegen optimize` and `cutegen resume`: run the agent over tasks, resumably.

Exit statuses: 0 the run finished (every task ended; see report.md), 2 a usage or settings error,
75 waiting for replies (every unfinished task waits on an `exchange` reply file: write the files
named, then `cutegen resume RUN`), 76 needs a GPU (copy the run directory to a CUDA machine and run
`cutegen resume RUN` there).
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from cutegen.agent import EXIT_NEEDS_GPU, EXIT_WAITING, Agent
from cutegen.cli import app, env
from cutegen.cli import options as opt
from cutegen.cli.common import (
    check_unique, copy_replay_file, executor_config, local_eval_config, open_library, provider_for_run,
    provider_spec_for_run, running_executor, step_printer, task_end_printer,
)
from cutegen.config import AgentConfig, Budget
from cutegen.journal import Journal, load_run, new_run_id, start_run
from cutegen.profile import make_profiler
from cutegen.records import from_json
from cutegen.report import write_outputs
from cutegen.tasks import load_tasks

STATUS_HELP = (
    "Exit status: 0 finished (see RUN/report.md); 2 bad settings; 75 waiting for replies (write the"
    " exchange reply files, then `cutegen resume RUN`); 76 needs a GPU (move the run directory to a"
    " CUDA machine and `cutegen resume RUN` there)."
)
console = Console(stderr=True, soft_wrap=True)  # a message is one line in a log, never cut at 80 columns


@app.command("optimize", help="Generate, test and refine a kernel for each task with a model. " + STATUS_HELP)
def optimize_command(
    tasks: list[Path] = typer.Argument(..., help="Task files, folders of task files, or a KernelBench checkout."),
    model: str = typer.Option(..., "--model", "-m", help="anthropic:MODEL, openai:MODEL, "
                              "openai-compatible:MODEL@URL, exchange:[DIR] or replay:FILE (recorded replies)."),
    select: str = typer.Option(None, "--select", "-s", help="Task selector, e.g. level1:1-20 or '*relu*'."),
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
    backend: opt.Backend = "cute",
    device: opt.Device = "cuda",
    track: opt.TrackBrief = "fp32",
    correctness_trials: opt.CorrectnessTrials = 5,
    timing_trials: opt.TimingTrials = 100,
    compile_baseline: opt.CompileBaseline = True,
    max_tokens: opt.MaxTokens = 16384,
    concurrency: opt.Concurrency = 4,
    executor: opt.ExecutorSpec = "local",
    ray_resource: opt.RayResource = None,
    runs_dir: opt.RunsDir = Path("runs"),
    run_id: str = typer.Option(None, "--run-id", help="Name of the run directory (default: time + random)."),
    library: opt.LibraryPath = None,
    no_library: opt.NoLibrary = False,
    library_examples: opt.LibraryExamples = 2,
    library_same_task: opt.LibrarySameTask = False,
) -> None:
    loaded = [task for path in tasks for task in load_tasks(path, select)]
    budget = Budget(llm_calls=budget_calls, tokens=budget_tokens, usd=budget_usd, gpu_s=budget_gpu_s,
                    wall_s=budget_wall_s)
    agent_config = AgentConfig(rounds=rounds, repairs=repairs, generations=generations, patience=patience,
                               profiling=profiling, target_sol_fraction=target_sol, max_tokens=max_tokens,
                               concurrency=concurrency, budget=budget, search=search, library=not no_library,
                               library_examples=library_examples, library_same_task=library_same_task)
    eval_config = local_eval_config(track=track, backend=backend, device=device, correctness_trials=correctness_trials,
                                     timing_trials=timing_trials, compile_baseline=compile_baseline)
    check_unique(loaded)
    store = open_library(library, no_library, device=device)  # an unusable file fails before the run starts
    where = executor_config(executor, ray_resource)
    provider_for_run(model, None)  # a missing key or file fails here, before the run directory exists
    run_dir = runs_dir / (run_id or new_run_id())
    spec = provider_spec_for_run(model)
    journal = Journal.create(run_dir)
    copy_replay_file(model, run_dir)
    start_run(journal, loaded, spec, agent_config, eval_config)
    console.print(f"run directory: {run_dir}")
    _execute(journal, agent_config, eval_config, where, store)


@app.command("resume", help="Continue a run from its journal: recorded replies and finished evaluations are"
                            " not repeated; works on another machine or path. " + STATUS_HELP)
def resume_command(
    run: Path = typer.Argument(..., help="The run directory (runs/<id>)."),
    concurrency: opt.Concurrency = None,
    executor: opt.ExecutorSpec = "local",
    ray_resource: opt.RayResource = None,
    library: opt.LibraryPath = None,
) -> None:
    journal = Journal.open(run)
    setup = load_run(journal)
    agent_config = from_json(AgentConfig, setup.agent)
    if concurrency:
        agent_config = from_json(AgentConfig, {**setup.agent, "concurrency": concurrency})
    eval_config = local_eval_config(**setup.evaluation)
    # The run's own choice: one started with --no-library uses none when resumed either.
    store = open_library(library, not agent_config.library, device=eval_config.device)
    _execute(journal, agent_config, eval_config, executor_config(executor, ray_resource), store)


# ------------------------------------------------------------------------------------ helpers


def _execute(journal, agent_config, eval_config, executor_settings, library=None) -> None:
    setup = load_run(journal)
    provider = provider_for_run(setup.model, journal.run_dir.resolve())

    rows: dict[str, tuple] = {t.task_id: (None, "queued") for t in setup.tasks}
    logging = not sys.stdout.isatty()  # a log gets one plain line per event; a terminal a live table
    live_table = contextlib.nullcontext() if logging else \
        Live(_table(rows), console=console, refresh_per_second=4, transient=False)
    with running_executor(executor_settings, eval_config) as executor, live_table as live:
        ended = task_end_printer() if logging else None

        def on_progress(result, activity: str) -> None:
            rows[result.task_id] = (result, activity)
            if ended is not None:
                ended(result)
            else:
                live.update(_table(rows))

        agent = Agent(journal, provider, agent_config, eval_config, profiler=_profiler(agent_config, eval_config),
                      executor=executor, on_progress=on_progress, on_step=step_printer() if logging else None,
                      library=library)
        journal.begin_session(host=platform.node(), argv=sys.argv[1:])
        status = asyncio.run(agent.run(list(setup.tasks)))
    results = [agent.result(t.task_id) for t in setup.tasks]
    write_outputs(journal, results)
    journal.append("exit", status=status, pending=[r.task_id for r in results if r.status != "done"])
    typer.echo(f"report: {journal.run_dir / 'report.md'}")
    if status == EXIT_WAITING:
        folder = getattr(provider, "folder", None)
        console.print(f"waiting for replies: write the reply files in {folder} (see the *.request.md files there),"
                      f" then run `cutegen resume {journal.run_dir}`.")
    elif status == EXIT_NEEDS_GPU:
        console.print(f"needs a GPU: copy {journal.run_dir} to a machine with a CUDA device and run"
                      f" `cutegen resume RUN` there.")
    # sys.exit, not typer.Exit: click returns an Exit's code (instead of exiting) when it does not
    # run in standalone mode, and the status is this command's answer.
    sys.exit(status)


def _profiler(agent_config, eval_config):
    """Nsight Compute feedback for the schedule's profile slot; only a CUDA run can be profiled."""
    if agent_config.profiling == "none" or eval_config.device != "cuda":
        return None

    return make_profiler(env.profile_config(), notify=lambda message: console.print(f"[yellow]{message}[/]"))


def _table(rows: dict) -> Table:
    table = Table(title="cutegen optimize", title_justify="left")
    for column in ("task", "stage", "steps", "rounds", "best vs eager", "calls", "cost $"):
        table.add_column(column, justify="left" if column in ("task", "stage") else "right")
    for task_id, (result, activity) in rows.items():
        if result is None:
            table.add_row(task_id, activity, "-", "-", "-", "-", "-")
            continue
        speedup = f"{result.speedup_vs_eager:.3g}x" if result.speedup_vs_eager is not None else "-"
        table.add_row(task_id, activity, str(result.steps), str(result.rounds), speedup,
                      str(result.llm_calls), f"{result.cost_usd:.4f}")
    return table
