"""On a CUDA machine: `--evaluate` judges CuTe candidate files right, and the torch-op export of the
winner runs inside torch.compile(fullgraph=True). (The full check, with the KernelBench export built
by load_inline, is tests/test_bench_evaluate_gpu.py.)"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from cutegen import bench, export
from cutegen.config import EvalConfig
from cutegen.tasks import load_tasks, task_module

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "tests" / "fixtures" / "bench_candidates"

pytestmark = pytest.mark.gpu


def test_evaluate_cute_files_and_compile_the_exported_op(tmp_path):
    folder = tmp_path / "candidates"
    folder.mkdir()
    for name in ("swish_scale.py", "swish_scale_sample_1.py", "row_softmax_sample_1.py"):
        shutil.copy(CANDIDATES / name, folder / name)
    tasks = load_tasks(REPO / "examples" / "tasks", "swish_scale,row_softmax")
    config = EvalConfig(device="cuda", backend="cute", timing_trials=20, compile_baseline=False,
                        cache_dir=tmp_path / "cache")
    results = bench.evaluate_suite(tasks, folder, tmp_path / "run", config, build_jobs=2)
    got = {(r.task_id, r.sample_id): (r.correctness, r.stage_reached, r.failure) for r in results}
    assert got[("swish_scale", 0)] == (True, "passed", None)
    assert got[("swish_scale", 1)] == (False, "build", "build_error")
    assert got[("row_softmax", 1)] == (False, "correctness", "compare_outputs")
    assert next(r for r in results if r.sample_id == 0).speedup_vs_eager > 0
    bench.write_results(tmp_path / "run", results, kind="evaluate", evaluation={"backend": "cute", "track": "fp32"})

    text, name = export.export_best(tmp_path / "run", "swish_scale", "torch-op")
    (tmp_path / name).write_text(text)
    spec = importlib.util.spec_from_file_location("swish_scale_op_gpu", tmp_path / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (task,) = load_tasks(REPO / "examples" / "tasks", "swish_scale")
    reference = task_module(task)
    x = reference.get_inputs()[0].cuda()
    op = module.ModelOp(*reference.get_init_inputs())
    with torch.no_grad():
        want = reference.Model(*reference.get_init_inputs())(x)
        torch._dynamo.reset()
        got_compiled = torch.compile(op, fullgraph=True)(x)
    torch.testing.assert_close(got_compiled, want, rtol=1e-5, atol=1e-6)
