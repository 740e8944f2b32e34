"""`cutegen export`: a task's best kernel as a KernelBench ModelNew file and as a torch custom op.

On CPU: torch-backend kernels judged by the evaluator are exported and run against the reference (the
KernelBench file loaded the way KernelBench loads it, the op inside torch.compile(fullgraph=True)); for
the CuTe example kernel, what can be checked without a GPU: the KernelBench file loads and its C++
launch shim compiles, and the op traces into one graph with its launchers skipped on fake tensors.
The GPU side (load_inline build, compiled op on CUDA) is in tests/test_bench_evaluate_gpu.py.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cutegen import bench, export
from cutegen.cli import main
from cutegen.config import EvalConfig
from cutegen.errors import ConfigError
from cutegen.tasks import load_tasks, task_module
from cutegen.runtime import Launcher
from cutegen.runtime import launch as runtime_launch

REPO = Path(__file__).resolve().parents[1]
CUTE_SWISH = REPO / "examples" / "candidates" / "swish_scale_cute.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """An --evaluate run over two honest torch candidates (linear_gelu has weights)."""
    work = tmp_path_factory.mktemp("export")
    folder = work / "candidates"
    folder.mkdir()
    for name in ("linear_gelu", "swish_scale"):
        shutil.copy(REPO / "tests" / "fixtures" / "honest" / f"{name}.py", folder / f"{name}.py")
    tasks = load_tasks(REPO / "examples" / "tasks", "linear_gelu,swish_scale")
    config = EvalConfig(backend="torch", device="cpu", correctness_trials=1, weight_seeds=1, timing_trials=5,
                        warmup_trials=1, timing_input_sets=1, timed_output_checks=1, compile_baseline=False,
                        cache_dir=work / "cache")
    out = work / "run"
    results = bench.evaluate_suite(tasks, folder, out, config)
    assert all(r.correctness for r in results)
    bench.write_results(out, results, kind="evaluate", evaluation={"backend": "torch", "track": "fp32"})
    return out


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference(task_name: str):
    (task,) = load_tasks(REPO / "examples" / "tasks", task_name)
    return task_module(task)


def test_kernelbench_file_loads_like_kernelbench_and_matches_the_reference(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["export", str(run), "linear_gelu", "--format", "kernelbench"])
    path = tmp_path / "linear_gelu.py"  # the task file's name, as --evaluate expects it
    source = path.read_text()
    assert source.startswith("# Task linear_gelu: a standalone KernelBench ModelNew file")
    context: dict = {}
    exec(compile(source, str(path), "exec"), context)  # KernelBench: exec the source, take ModelNew
    ref = _reference("linear_gelu")
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs())
    torch.manual_seed(0)
    new = context["ModelNew"](*ref.get_init_inputs())
    x = ref.get_inputs()[0]
    torch.testing.assert_close(new(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(SystemExit) as again:  # never overwrites silently
        main(["export", str(run), "linear_gelu"])
    assert again.value.code == 2


def test_torch_op_runs_inside_a_fullgraph_compile(run, tmp_path):
    from torch._dynamo.testing import CompileCounterWithBackend

    text, name = export.export_best(run, "linear_gelu", "torch-op")
    assert name == "linear_gelu_op.py"
    (tmp_path / name).write_text(text)
    module = _load(tmp_path / name, "linear_gelu_op")
    ref = _reference("linear_gelu")
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs())
    torch.manual_seed(0)
    op = module.ModelOp(*ref.get_init_inputs())
    x = ref.get_inputs()[0]
    counter = CompileCounterWithBackend("aot_eager")  # fake-tensor tracing and functionalization, no C++ build
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(op, fullgraph=True, backend=counter)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(op(x), model(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1
    targets = [str(node.target) for node in counter.graphs[0].graph.nodes if node.op == "call_function"]
    assert any(t.startswith("cutegen.linear_gelu_") for t in targets), targets


def test_best_result_names_and_errors(run):
    loaded = bench.load_run(run)
    assert export.best_result(loaded, "swish_scale").task_id == "swish_scale"
    with pytest.raises(ConfigError, match="has no task 'relu'"):
        export.best_result(loaded, "relu")
    with pytest.raises(ConfigError, match="format"):
        export.export_best(run, "swish_scale", "onnx")
    suite = export.best_result(loaded, "swish_scale")
    from dataclasses import replace

    assert export.kernelbench_file_name(replace(suite, level=1, problem_id=19)) == "level_1_problem_19_sample_0_kernel.py"


def test_cute_kernel_exports_load_without_a_gpu(run, tmp_path):
    result = export.best_result(bench.load_run(run), "swish_scale")
    loaded = bench.load_run(run)
    source = CUTE_SWISH.read_text()
    kb = export.kernelbench_source(source, result, loaded)
    assert "from cutegen" not in kb and "load_inline" in kb
    context: dict = {}
    exec(compile(kb, "kb.py", "exec"), context)  # nothing builds until a launcher is called
    kernel = context["kernel"]
    assert type(kernel).__name__ == "CuteKernel" and kernel.functions == {"swish_scale": ("f32*", "f32*", "i64", "f32")}
    context["ModelNew"](1.5)
    if shutil.which("g++"):  # the generated C++ launch shim (load_inline adds torch/extension.h to it)
        shim = tmp_path / "shim.cpp"
        shim.write_text(kernel._shim())
        done = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", str(shim)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_cute_torch_op_traces_into_one_graph_with_launchers_skipped(run, tmp_path, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    result = export.best_result(bench.load_run(run), "swish_scale")
    text = export.torch_op_source(CUTE_SWISH.read_text(), result, bench.load_run(run))
    (tmp_path / "swish_op.py").write_text(text)
    module = _load(tmp_path / "swish_op.py", "swish_op")
    op = module.ModelOp(1.5)
    with FakeTensorMode():  # the op's fake implementation: shapes from forward's allocations, no launch
        out = op(torch.empty(64, 128))
    assert tuple(out.shape) == (64, 128) and out.dtype == torch.float32
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: (torch.zeros(64, 128),)  # nothing runs: there is no GPU to launch on

    torch._dynamo.reset()
    torch.compile(op, fullgraph=True, backend=recording_backend)(torch.randn(64, 128))
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert len(graphs) == 1 and any(t.startswith("cutegen.swish_scale_") for t in targets), targets
    with pytest.raises(Exception, match="CUDA"):  # the real launcher still refuses CPU tensors
        op(torch.randn(4, 4))
    # The launchers stay Launchers: a first call builds the library and binds each one (a plain
    # wrapper function here once broke every exported op on its first real call).
    kernel = module.kernel
    assert all(isinstance(getattr(kernel, f), Launcher) for f in kernel.functions)
    bound = []
    monkeypatch.setattr(Launcher, "_bind", lambda self, library: bound.append(self.name))
    monkeypatch.setattr(runtime_launch, "build_library", lambda source, config: "built")
    monkeypatch.setattr(runtime_launch, "_load", lambda result, kernel: object())
    kernel.build()
    assert bound == list(kernel.functions)
    sys.modules.pop("swish_op", None)
