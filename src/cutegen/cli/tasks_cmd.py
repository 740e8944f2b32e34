"""`cutegen tasks`: list the tasks of a file, folder or suite with their workload class and size."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cutegen.cli import app
from cutegen.errors import TaskError
from cutegen.records import to_json
from cutegen.tasks import load_tasks
from cutegen.trace import trace_task


@app.command("tasks")
def tasks_command(
    path: Path = typer.Argument(..., help="A task file, a folder of task files, or a KernelBench checkout."),
    select: str = typer.Option(None, "--select", "-s", help="e.g. level1, level2:1-20, level1/19, '*relu*'."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List tasks with their workload class, FLOPs and minimum bytes moved (traced on meta tensors)."""

    tasks = load_tasks(path, select)
    rows = []
    with Progress(console=Console(stderr=True), transient=True, disable=len(tasks) < 5) as progress:
        for task in progress.track(tasks, description="tracing"):
            try:
                trace, error = trace_task(task), None
            except TaskError as err:  # one broken file must not hide the others
                cause = err.__cause__
                trace, error = None, f"{type(cause).__name__}: {cause}" if cause else err.problem
            rows.append((task, trace, error))
    if as_json:
        payload = [_json_row(task, trace, error, to_json) for task, trace, error in rows]
        typer.echo(json.dumps(payload, indent=1))
        return
    _print_table(rows)


def _json_row(task, trace, error, to_json) -> dict:
    row = {k: v for k, v in to_json(task).items() if k != "source"}
    if trace is not None:
        row.update(to_json(trace))
        row["min_bytes"] = trace.min_bytes
        error = trace.error
    row["error"] = error
    return row


def _print_table(rows) -> None:
    table = Table(show_lines=False)
    for column in ("task", "class", "GFLOP", "MB", "ops"):
        table.add_column(column, justify="right" if column in ("GFLOP", "MB") else "left")
    for task, trace, error in rows:
        if trace is None or trace.error:
            table.add_row(task.task_id, "[red]error[/]", "", "", (error or trace.error)[:80])
            continue
        table.add_row(
            task.task_id,
            trace.workload_class,
            f"{trace.flops / 1e9:.2f}",
            f"{trace.min_bytes / 1e6:.1f}",
            ",".join(trace.aten_ops)[:60],
        )
    Console().print(table)
