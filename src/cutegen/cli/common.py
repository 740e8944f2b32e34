"""What several commands share: the one task of --task/--select, this machine's evaluation settings,
the executor and the model provider of a run, and the plain log lines of an agent run (`optimize`,
`resume` and `bench` run the agent alike). The command modules import this one, never each other."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import typer
from rich.console import Console

from cutegen import bench
from cutegen.cli import env
from cutegen.config import EvalConfig, parse_executor
from cutegen.errors import ConfigError
from cutegen.evaluate.executor import make_executor
from cutegen.evaluate.ray_executor import import_ray
from cutegen.llm import provider_from_spec
from cutegen.records import Task, from_json, to_json
from cutegen.tasks import load_tasks

console = Console(stderr=True, soft_wrap=True)  # a message is one line in a log, never cut at 80 columns


# --------------------------------------------------------------------------- tasks and settings


def one_task(path: Path, select: str | None) -> Task:
    """The one task of --task (and --select) that a command on one candidate needs."""
    tasks = load_tasks(path, select)
    if len(tasks) != 1:
        listed = ", ".join(t.task_id for t in tasks[:5]) + (" ..." if len(tasks) > 5 else "")
        raise ConfigError(f"--task {path} {'with --select ' + select if select else ''} names {len(tasks)}"
                          f" tasks ({listed}); a candidate goes with exactly one.",
                          "Pass a task file, or a suite with --select naming one task (e.g. level1/19).")
    return tasks[0]


def check_unique(tasks: list) -> None:
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise ConfigError(f"Task {task.task_id} is given twice.", "Name each task once.")
        seen.add(task.task_id)


def local_eval_config(**fields: Any) -> EvalConfig:
    """An EvalConfig with this machine's caches and toolchain and the given judgement settings."""
    local = EvalConfig(backend="torch", device="cpu", cache_dir=env.cache_root() / "eval", runtime=env.runtime_config())
    return from_json(EvalConfig, {**to_json(local), **fields})


def executor_config(spec: str, resource: str | None):
    """--executor and --ray-resource as an ExecutorConfig, checked before anything starts (ray installed)."""
    config = parse_executor(spec, resource)
    if config.kind == "ray":
        import_ray()
    return config

# ------------------------------------------------------------ a run: its executor and its model


@contextlib.contextmanager
def running_executor(config, eval_config, build_jobs: int | None = None) -> Iterator:
    """The executor for a session (a Ray executor joins its cluster and starts its actors here)."""
    executor = make_executor(config, eval_config, build_jobs=build_jobs)
    if config.kind == "ray":
        console.print(f"evaluations on Ray: {executor.lanes} actor(s) of resource {executor.resource}")
    try:
        yield executor
    finally:
        executor.close()


def provider_spec_for_run(model: str) -> str:
    """The spec as the run records it: a replay file is copied into the run directory and an
    exchange folder given on the command line is made absolute (relative paths in a recorded spec
    are relative to the run directory)."""
    kind, _, rest = model.partition(":")
    if kind == "replay" and rest:
        return "replay:replay.jsonl"
    if kind == "exchange" and rest:
        return f"exchange:{Path(rest).expanduser().resolve()}"
    return model


def copy_replay_file(model: str, run_dir: Path) -> None:
    """A replay file given as the model is copied into the run directory (provider_spec_for_run)."""
    kind, _, rest = model.partition(":")
    if kind == "replay" and rest:
        (run_dir / "replay.jsonl").write_bytes(Path(rest).expanduser().read_bytes())


def provider_for_run(spec: str, run_dir: Path | None) -> Any:
    """The model provider of a spec, with this machine's settings and the run's state folder."""
    return provider_from_spec(spec, env.provider_settings(state_dir=run_dir.resolve() if run_dir else None))

# ------------------------------------------------------------------------------------ log lines


def log_line(text: str) -> None:
    """One event in a log (stdout is not a terminal): the time, then the event on one plain line, flushed."""
    typer.echo(f"{time.strftime('%H:%M:%S')} {' '.join(text.split())}")
    sys.stdout.flush()


def step_printer() -> Any:
    """An Agent on_step callback logging one line per finished step (bench.step_line)."""
    def on_step(step: Any) -> None:
        label = f"{step.stage}" + (f" (round {step.round})" if step.round else "")
        log_line(bench.step_line(step.task_id, label, step.verdict, step.bad_reply and f"unusable reply:"
                                                                                     f" {step.bad_reply}"))

    return on_step


def task_end_printer() -> Any:
    """An on_progress helper logging one line when a task stops (bench.task_end_line), once per task."""
    logged: set[str] = set()

    def on_progress(result: Any) -> None:
        if result.status != "running" and result.task_id not in logged:
            logged.add(result.task_id)
            log_line(bench.task_end_line(result))

    return on_progress
