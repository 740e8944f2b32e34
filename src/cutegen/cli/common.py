"""What several commands share: the one task of --task/--select, this machine's evaluation settings,
the kernel library a command opens (--library / --no-library) and adds accepted kernels to, the
executor and the model provider of a run, and the plain log lines of an agent run (`optimize`,
`resume` and `bench` run the agent alike). The command modules import this one, never each other."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import typer
from rich.console import Console

from cutegen import bench
from cutegen.cli import env
from cutegen.config import EvalConfig, LibraryConfig, parse_executor
from cutegen.errors import ConfigError
from cutegen.evaluate.executor import make_executor
from cutegen.evaluate.ray_executor import import_ray
from cutegen.library import KernelLibrary, arch_name, provenance, task_signature
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
    """A ConfigError for a task named twice in one run."""
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise ConfigError(f"Task {task.task_id} is given twice.", "Name each task once.")
        seen.add(task.task_id)


def local_eval_config(**fields: Any) -> EvalConfig:
    """An EvalConfig with this machine's caches and toolchain and the given judgement settings."""
    local = EvalConfig(backend="torch", device="cpu", cache_dir=env.cache_root() / "eval", runtime=env.runtime_config())
    return from_json(EvalConfig, {**to_json(local), **fields})


def executor_config(spec: str, resource: str | None) -> Any:
    """--executor and --ray-resource as an ExecutorConfig, checked before anything starts (ray installed)."""
    config = parse_executor(spec, resource)
    if config.kind == "ray":
        import_ray()
    return config


# ------------------------------------------------------------------------------ the kernel library


def open_library(path: Path | None, off: bool, *, device: str = "cuda", gpu: int = 0) -> Any:
    """The library a command uses (None with --no-library), labelled with this machine's architecture."""
    if off:
        if path is not None:
            raise ConfigError("--library was given where no kernel library is used (--no-library).",
                              "Keep --library PATH to use that file, or --no-library to use none (a run started"
                              " with --no-library keeps it when resumed).")
        return None
    arch, name = machine_arch(device, gpu, env.runtime_config().arch)
    return KernelLibrary(LibraryConfig(path=path or env.library_path(), arch=arch, device_name=name))


def machine_arch(device: str, gpu: int, configured: str | None) -> tuple[str | None, str | None]:
    """(architecture, device name) where this process's verdicts are measured: "cpu" for device cpu;
    else the GPU as nvidia-smi names it (no CUDA context is made in this process), else CUTEGEN_ARCH."""
    if device == "cpu":
        return "cpu", None
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", str(gpu)],
                                 capture_output=True, text=True, timeout=20, check=False)
            name, _, capability = out.stdout.strip().splitlines()[0].rpartition(",")
            if out.returncode == 0 and name.strip():
                return arch_name(capability.strip()), name.strip()
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    return arch_name(configured), None


def add_accepted(store: Any, task: Any, candidate: Path, verdict: Any, origin: str, run_id: str | None = None,
                 signatures: dict | None = None) -> tuple[int | None, str]:
    """Add a passing verdict on the file `candidate` to the library: (the new entry's id, or None; a
    line saying what became of it). `signatures` caches task signatures by task id across calls."""
    cache = signatures if signatures is not None else {}
    if task.task_id not in cache:
        cache[task.task_id] = task_signature(task)
    try:
        added = store.add_verdict(task, cache[task.task_id], candidate.read_text(encoding="utf-8"), verdict,
                                  provenance(origin, None, run_id))
    except ValueError as err:  # the file changed after it was judged: its verdict is not the file's
        return None, f"kernel library {store.path}: {candidate} not added ({err})"
    return added, f"kernel library {store.path}: " + (f"added as entry {added}" if added else "already there")


# ------------------------------------------------------------ a run: its executor and its model


@contextlib.contextmanager
def running_executor(config: Any, eval_config: EvalConfig, build_jobs: int | None = None) -> Iterator:
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
