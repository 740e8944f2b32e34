"""Export a task's best kernel from a run: as a standalone KernelBench ModelNew file, or as a torch
custom op that a compiled graph can call.

kernelbench
    The candidate's source with its `from cutegen.runtime import CuteKernel` replaced by a stand-in
    CuteKernel that builds the same CUDA source with torch.utils.cpp_extension.load_inline, as
    KernelBench's own CUDA and CuTe samples do (templates/export/kernelbench_runtime.py.txt). The file
    needs no cutegen: KernelBench loads it by exec-ing the source and taking `ModelNew`. A torch-backend
    candidate (no CuTe kernels) is exported as it is.
torch-op
    The candidate's source (still built by cutegen.runtime), then a custom op
    `torch.ops.cutegen.<task>_<sha8>` registered with torch.library.custom_op, whose fake
    implementation runs forward on fake tensors with the launchers skipped, and `ModelOp`, a module
    with ModelNew's constructor whose forward is one call of the op, so
    `torch.compile(ModelOp(...), fullgraph=True)` traces it without a graph break.

The provenance (run, task, candidate hash, the speedups measured, the precision track) goes into a
comment header: a comment, not a docstring, so a candidate's own `from __future__` import stays first.
"""

from __future__ import annotations

import ast
import re
import textwrap
from importlib import resources
from pathlib import Path

from cutegen import bench
from cutegen.errors import ConfigError
from cutegen.journal import task_file_name
from cutegen.prompt import render_template
from cutegen.records import BenchRun, BenchTaskResult

FORMATS = ("kernelbench", "torch-op")


def export_best(run_dir: Path, task: str, fmt: str) -> tuple[str, str]:
    """(exported source, default file name) for the best correct kernel of `task` in a run."""

    if fmt not in FORMATS:
        raise ConfigError(f"Export format {fmt!r} is not one of {', '.join(FORMATS)}.",
                          "Pass --format kernelbench or --format torch-op.")
    run = bench.load_run(run_dir)
    result = best_result(run, task)
    source = (run.path / result.candidate_path).read_text(encoding="utf-8")
    if fmt == "kernelbench":
        return kernelbench_source(source, result, run), kernelbench_file_name(result)
    return torch_op_source(source, result, run), f"{result.name}_op.py"


def best_result(run: BenchRun, task: str) -> BenchTaskResult:
    """The task's fastest correct result (of its samples, for an --evaluate run)."""

    mine = [r for r in run.results if task in (r.task_id, r.name, task_file_name(r.task_id))]
    if not mine:
        known = ", ".join(sorted({r.task_id for r in run.results})[:8])
        raise ConfigError(f"Run {run.run_id} has no task {task!r} (tasks: {known}).",
                          "Name the task by its id (level1/19) or file stem (19_ReLU).")
    correct = [r for r in mine if r.correctness and r.candidate_path]
    if not correct:
        raise ConfigError(f"Task {task} has no correct kernel in run {run.run_id} (furthest stage: "
                          f"{mine[0].stage_reached}{': ' + mine[0].failure if mine[0].failure else ''}).",
                          "Export a task whose kernel passed; the report lists them.")
    return max(correct, key=lambda r: r.speedup_vs_eager or 0.0)


def kernelbench_file_name(result: BenchTaskResult) -> str:
    """KernelBench's generation naming for suite tasks, the task file's stem otherwise."""
    if result.level is not None and result.problem_id is not None:
        return f"level_{result.level}_problem_{result.problem_id}_sample_0_kernel.py"
    return f"{result.name}.py"


def kernelbench_source(source: str, result: BenchTaskResult, run: BenchRun) -> str:
    stand_in = _data("kernelbench_runtime.py.txt")
    body = _replace_runtime_import(source, stand_in)
    note = ("Load it as KernelBench does: exec the file and take ModelNew. Its CuTe kernels build with"
            " torch.utils.cpp_extension.load_inline on first use (nvcc and the CUTLASS headers needed)."
            if body != source else "Load it as KernelBench does: exec the file and take ModelNew.")
    return _header(result, run, "a standalone KernelBench ModelNew file", note) + body


def torch_op_source(source: str, result: BenchTaskResult, run: BenchRun) -> str:
    body = _replace_runtime_import(source, _data("torch_op_runtime.py.txt"))
    op_name = re.sub(r"\W", "_", result.name).strip("_") + f"_{(result.candidate_sha256 or '')[:8]}"
    if not op_name[0].isalpha():
        op_name = "task_" + op_name
    note = (f"Use ModelOp(<the task's constructor arguments>) like ModelNew; its forward is one call of"
            f" torch.ops.cutegen.{op_name}, which torch.compile(fullgraph=True) keeps as one graph node."
            " Inference only (the op has no backward): call it under torch.no_grad() or torch.inference_mode().")
    op = render_template("export/torch_op.py.j2", op_name=op_name)
    return _header(result, run, "a registered torch custom op", note) + body.rstrip("\n") + "\n" + op


def _data(name: str) -> str:
    return resources.files("cutegen").joinpath(f"templates/export/{name}").read_text(encoding="utf-8")


def _header(result: BenchTaskResult, run: BenchRun, what: str, note: str) -> str:
    def x(value: float | None) -> str:
        return f"{value:.3g}x" if value is not None else "not measured"

    gpu = run.manifest.get("gpu_name") or "no GPU recorded"
    lines = [
        f"Task {result.task_id}: {what}, exported by cutegen from run {run.run_id}",
        f"(candidate {result.candidate_sha256}).",
        f"Measured by the cutegen evaluator ({run.evaluation.get('backend', '?')} backend, precision track"
        f" {run.evaluation.get('track', '?')}, {gpu}): {x(result.speedup_vs_eager)} vs eager PyTorch,"
        f" {x(result.speedup_vs_compile)} vs torch.compile"
        + (f", {100 * result.sol_fraction:.0f}% of the reference algorithm's work bound." if result.sol_fraction is not None else "."),
        note,
    ]
    wrapped = []
    for line in lines:
        wrapped += _wrap(line, 98)
    return "".join(f"# {line}\n" for line in wrapped) + "\n"


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width) or [""]


def _replace_runtime_import(source: str, stand_in: str) -> str:
    """The source with its `from cutegen.runtime import CuteKernel` replaced by `stand_in`; unchanged
    when it imports nothing from cutegen. Any other use of cutegen cannot be exported standalone."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "cutegen" for a in node.names):
            raise ConfigError("The kernel imports the cutegen package itself (`import cutegen...`).",
                              "Export works for candidates that use `from cutegen.runtime import CuteKernel`,"
                              " as the candidate contract asks.")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cutegen":
            names = {a.name for a in node.names}
            if node.module != "cutegen.runtime" or names - {"CuteKernel"} or node not in tree.body:
                raise ConfigError(f"The kernel imports {', '.join(sorted(names))} from {node.module} (line"
                                  f" {node.lineno}); only a module-level `from cutegen.runtime import CuteKernel`"
                                  " can be exported.", "Export a kernel that follows the candidate contract.")
            found.append(node)
    if not found:
        return source
    lines = source.splitlines(keepends=True)
    for node in sorted(found, key=lambda n: n.lineno, reverse=True):
        block = stand_in if node is min(found, key=lambda n: n.lineno) else ""
        lines[node.lineno - 1: node.end_lineno] = [block]
    return "".join(lines)
