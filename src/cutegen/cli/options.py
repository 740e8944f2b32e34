"""Command-line options shared by several commands, declared once as `Annotated` types.

A command module does `from cutegen.cli import options as opt` and writes `rounds: opt.Rounds = 5`: the
option's name and help live here, its default stays at the parameter (commands may differ, e.g.
`--concurrency`). Only options whose name and help are the same
in every command that uses them belong here. (Not a `*_cmd` module: it registers no command.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# ------------------------------------------------------------------------------ the agent's workflow

Rounds = Annotated[int, typer.Option("--rounds", help="Optimization rounds per task.")]
Repairs = Annotated[int, typer.Option("--repairs", help="Repairs per failing candidate.")]
Generations = Annotated[int, typer.Option("--generations", help="Fresh starts per task while none is correct.")]
Patience = Annotated[int, typer.Option("--patience", help="Stop a task after this many rounds without gain.")]
Profiling = Annotated[str, typer.Option("--profiling", help="none, immediate or delayed:K.")]
TargetSol = Annotated[float, typer.Option("--target-sol", help="Stop a task once its best kernel reaches this fraction of"
                                         " the reference algorithm's work bound and beats eager and torch.compile.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="Reply limit of each model call.")]
Concurrency = Annotated[int, typer.Option("--concurrency", help="Model calls in flight at once.")]
Search = Annotated[str, typer.Option("--search", help="single (one kernel refined per round), best-of:N (N"
                                     " generations side by side, the best correct kept) or beam:W,K (K proposals"
                                     " in different directions from each of the W best kernels per round).")]

# ------------------------------------------------------------------------------ run-wide budgets

BudgetUsd = Annotated[float, typer.Option("--budget-usd", help="Run-wide dollar limit.")]
BudgetCalls = Annotated[int, typer.Option("--budget-calls", help="Run-wide limit on model calls.")]
BudgetTokens = Annotated[int, typer.Option("--budget-tokens", help="Run-wide limit on tokens (in + out).")]
BudgetGpuS = Annotated[float, typer.Option("--budget-gpu-s", help="Run-wide limit on GPU seconds.")]
BudgetWallS = Annotated[float, typer.Option("--budget-wall-s", help="Run-wide limit on wall seconds.")]

# ------------------------------------------------------------------------------ evaluation

Backend = Annotated[str, typer.Option("--backend", help="cute (own kernels written with CuTe), cuda (own CUDA"
                                       " kernels, CuTe optional) or torch (plain torch ops).")]
Device = Annotated[str, typer.Option("--device", help="cuda, or cpu (backend torch only).")]
Track = Annotated[str, typer.Option("--track", help="Precision track: fp32 (TF32 off, 1e-4) or tf32 (1e-2).")]
TrackBrief = Annotated[str, typer.Option("--track", help="Precision track: fp32 or tf32.")]
CorrectnessTrials = Annotated[int, typer.Option("--correctness-trials", help="Correctness trials per candidate.")]
TimingTrials = Annotated[int, typer.Option("--timing-trials", help="Timed calls per measurement.")]
CompileBaseline = Annotated[bool, typer.Option("--compile-baseline/--no-compile-baseline",
                                               help="Also time torch.compile as a baseline.")]

# ------------------------------------------------------------------------------ where evaluations run

ExecutorSpec = Annotated[str, typer.Option("--executor", help="local (this machine's GPUs) or ray[:ADDRESS] (a Ray"
                                           " cluster, one GPU per evaluation; pip install cutegen[ray]).")]
RayResource = Annotated[str, typer.Option("--ray-resource", help="With --executor ray: the resource one evaluation"
                                          " actor takes (default GPU; CPU with --device cpu).")]

# ------------------------------------------------------------------------------ the kernel library

LibraryPath = Annotated[Path, typer.Option("--library", help="The kernel library file (default: library.sqlite"
                                           " in the cache folder, or CUTEGEN_LIBRARY).")]
NoLibrary = Annotated[bool, typer.Option("--no-library", help="Use no kernel library: no examples in prompts,"
                                         " no accepted kernel added to any library.")]
LibraryExamples = Annotated[int, typer.Option("--library-examples", help="Verified kernels of similar tasks"
                                              " from the library shown in each generate and optimize prompt.")]
LibrarySameTask = Annotated[bool, typer.Option("--library-same-task", help="Also show the task's own earlier"
                                               " kernels from the library.")]

# ------------------------------------------------------------------------------ run directories

RunsDir = Annotated[Path, typer.Option("--runs-dir", help="Where run directories are made.")]
