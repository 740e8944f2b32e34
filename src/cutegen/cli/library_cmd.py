"""`cutegen library`: the kernel library of verified kernels (library.py) — list, show, search, export,
import and prune. Tables on a terminal, JSON with --json. The other commands open the library through
cli/common.py (`open_library`: --library / --no-library, and this machine's architecture).

Exit statuses: 0 done, 2 a usage error or an unusable library file (the message names it and the fix).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cutegen.cli import app, env
from cutegen.cli import options as opt
from cutegen.cli.common import one_task, open_library
from cutegen.config import LibraryConfig
from cutegen.errors import ConfigError
from cutegen.library import (
    KernelLibrary, export_entry, fastest_per_task, import_run, shapes_text, speed_text, task_signature,
)
from cutegen.records import to_json

library_app = typer.Typer(help="The library of verified kernels: every kernel accepted by eval, optimize and"
                               " bench, found again by similar tasks.", no_args_is_help=True)
app.add_typer(library_app, name="library")


# ------------------------------------------------------------------------------ helpers


def _existing(path: Path | None) -> Any:
    """The library at `path` (default: the CLI's), which must exist: reading never makes a new one."""

    path = path or env.library_path()
    if not path.is_file():
        raise ConfigError(f"There is no kernel library at {path} yet.",
                          "cutegen eval, optimize and bench add every kernel they accept to it; `cutegen library"
                          " import RUN` adds a finished run's. Or name another file with --library PATH.")
    return KernelLibrary(LibraryConfig(path=path))


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _summary(entry: Any) -> dict[str, Any]:
    """An entry without its source and verdict, for lists."""

    data = to_json(entry)
    for key in ("source", "verdict"):
        data.pop(key)
    return data


def _entries_table(title: str, entries: list, extra: dict[str, list[str]] | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("id", "task", "class", "backend", "arch", "track", "median ms", "vs eager", "vs compile",
                   "work bound", "model", "added", *(extra or {})):
        table.add_column(column, justify="right" if column in ("id", "median ms", "vs eager", "vs compile",
                                                               "work bound") else "left")
    for row, e in enumerate(entries):
        m = e.measured
        table.add_row(str(e.entry_id), e.task_id, e.signature.op_class, e.backend, e.arch, e.track,
                      f"{m.median_ms:.4g}" if m.median_ms is not None else "-", _x(m.speedup_vs_eager),
                      _x(m.speedup_vs_compile), f"{m.sol_fraction:.0%}" if m.sol_fraction is not None else "-",
                      e.provenance.model or e.provenance.origin, e.provenance.added_utc[:10],
                      *(values[row] for values in (extra or {}).values()))
    return table


# ------------------------------------------------------------------------------ commands


@library_app.command("list")
def list_command(
    op_class: str = typer.Option(None, "--class", help="Only this op class (gemm, elementwise, norm...)."),
    task: str = typer.Option(None, "--task", help="Only this task (its id, e.g. level1/19, or file stem)."),
    backend: str = typer.Option(None, "--backend", help="Only this backend (cute, cuda, torch)."),
    arch: str = typer.Option(None, "--arch", help="Only kernels measured on this architecture (e.g. sm_90)."),
    limit: int = typer.Option(None, "--limit", help="At most this many."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    library: opt.LibraryPath = None,
) -> None:
    """The library's kernels, oldest first."""

    path = library or env.library_path()
    entries = _existing(path).entries(op_class=op_class, task=task, backend=backend, arch=arch, limit=limit) \
        if path.is_file() else []
    if as_json:
        typer.echo(json.dumps([_summary(e) for e in entries], indent=1))
        return
    Console().print(_entries_table(f"kernel library {path}: {len(entries)} kernel(s)", entries))


@library_app.command("show")
def show_command(
    entry: str = typer.Argument(..., help="The entry's id (from `cutegen library list`) or a prefix of its hash."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole entry as JSON."),
    library: opt.LibraryPath = None,
) -> None:
    """One kernel: its task's signature, what was measured where, its provenance and its source."""

    found = _existing(library).get(entry)
    if as_json:
        typer.echo(json.dumps(to_json(found), indent=1))
        return
    sig, where = found.signature, found.provenance
    lines = [f"entry {found.entry_id}: task {found.task_id} ({found.task_name}), kernel {found.content_sha256}",
             f"signature: {sig.op_class}; aten ops {', '.join(sig.aten_ops) or '-'}; {shapes_text(sig)};"
             f" parameters {', '.join(sig.params) or '-'}",
             f"measured: {speed_text(found)}",
             f"verdict: {found.measured.feedback}",
             f"provenance: {where.origin}, model {where.model or '-'}, run {where.run_id or '-'}, added"
             f" {where.added_utc}, cutegen {where.cutegen_version}"]
    typer.echo("\n".join(lines) + "\n\n" + found.source)


@library_app.command("search")
def search_command(
    task: Path = typer.Argument(None, help="A task file (or a suite with --select naming one task)."),
    select: str = typer.Option(None, "--select", "-s", help="One task of a suite, e.g. level1/19."),
    op_class: str = typer.Option(None, "--class", help="Instead of a task: the fastest kernel of each task of"
                                 " this op class."),
    k: int = typer.Option(5, "-k", help="How many to list."),
    backend: opt.Backend = "cute",
    track: opt.TrackBrief = "fp32",
    same_task: opt.LibrarySameTask = False,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    library: opt.LibraryPath = None,
) -> None:
    """The kernels a prompt for TASK would be shown (nearest first, one per task), or those of an op class."""

    if (task is None) == (op_class is None):
        raise ConfigError("cutegen library search needs a task file or --class, and not both.",
                          "Pass a task (e.g. examples/tasks/row_softmax.py) or --class reduction.")
    store = _existing(library)
    if op_class is not None:  # the fastest kernel of each task, as retrieval shows them, fastest first
        best = fastest_per_task(store.entries(op_class=op_class))
        found = [(e, None) for e in sorted(best, key=lambda e: -(e.measured.speedup_vs_eager or 0.0))][:k]
    else:
        chosen = one_task(task, select)
        found = store.neighbours(task_signature(chosen), backend=backend, track=track, task=chosen,
                                 same_task=same_task, k=k)
    if as_json:
        typer.echo(json.dumps([{**_summary(e), "distance": to_json(d)} for e, d in found], indent=1))
        return
    distances = {"distance (class, dtypes, anchor, ops, size, arch)": [
        "-" if d is None else f"{d.other_class}, {d.dtype_distance:.2f}, {d.other_anchor}, {d.op_distance:.2f},"
                              f" {d.shape_distance:.1f}, {d.other_arch}" for _, d in found]}
    Console().print(_entries_table(f"{len(found)} kernel(s)", [e for e, _ in found], distances))


@library_app.command("export")
def export_command(
    entry: str = typer.Argument(..., help="The entry's id or a prefix of its hash."),
    fmt: str = typer.Option("kernelbench", "--format", "-f", help="kernelbench or torch-op."),
    out: Path = typer.Option(None, "--out", "-o", help="The file to write (default: a KernelBench-style name)."),
    force: bool = typer.Option(False, "--force", help="Overwrite the file if it exists."),
    library: opt.LibraryPath = None,
) -> None:
    """Write a library kernel as a standalone KernelBench ModelNew file or a registered torch custom op."""

    text, name = export_entry(_existing(library).get(entry), fmt)
    target = out or Path(name)
    if target.exists() and not force:
        raise ConfigError(f"{target} exists.", "Pass --out with another path, or --force to overwrite it.")
    target.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {target}")


@library_app.command("import")
def import_command(
    runs: list[Path] = typer.Argument(..., help="Finished run directories (cutegen optimize, bench, bench --evaluate)."),
    suite: Path = typer.Option(None, "--suite", help="The tasks of a bench --evaluate run, when its recorded suite"
                               " path is not found from here."),
    arch: str = typer.Option(None, "--arch", help="Where the run was measured (e.g. sm_90), when its bench.json"
                             " does not say."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a line per run."),
    library: opt.LibraryPath = None,
) -> None:
    """Add every accepted kernel of finished runs (kernels already there are not added twice)."""

    store = open_library(library, False)
    report = []
    for run in runs:
        ids, entries = import_run(store, run, suite=suite, arch=arch)
        report.append({"run": str(run), "accepted": len(entries), "added": sum(i is not None for i in ids),
                       "ids": [i for i in ids if i is not None]})
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    for row in report:
        typer.echo(f"{row['run']}: {row['accepted']} accepted kernel(s), {row['added']} added to {store.path}"
                   f" ({row['accepted'] - row['added']} already there)")


@library_app.command("prune")
def prune_command(
    keep: int = typer.Option(None, "--keep", help="Keep the N fastest kernels of each task, backend, arch and track."),
    before: str = typer.Option(None, "--before", help="Remove kernels added before this date (YYYY-MM-DD)."),
    task: str = typer.Option(None, "--task", help="Only this task's kernels."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would go, remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    library: opt.LibraryPath = None,
) -> None:
    """Remove kernels: all but the fastest N per task, or those added before a date."""
    store = _existing(library)
    removed = store.prune(keep=keep, before=before, task=task, dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps({"dry_run": dry_run, "removed": [_summary(e) for e in removed]}, indent=1))
        return
    verb = "would remove" if dry_run else "removed"
    Console().print(_entries_table(f"{verb} {len(removed)} kernel(s) from {store.path}", removed))
