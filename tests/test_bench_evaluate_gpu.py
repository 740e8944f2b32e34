"""`cutegen bench --evaluate` and `cutegen export` on the GPU, through the CLI as a user runs them.

- The bench judges tests/fixtures/bench_candidates/ (6 honest CuTe kernels, 7 broken: a compile error,
  wrong results, a cheating op call, an illegal address, a launch error) on the six example tasks with
  the full protocol (both baselines): each file gets the verdict its `# expect:` line names. The suite
  summary and the report are kept.
- The winner of swish_scale, exported as a KernelBench file, loads as KernelBench loads it (exec the
  source, take ModelNew; its CuTe kernel built by torch's load_inline) in a fresh process, standalone,
  and matches the reference.
- The winner of linear_gelu (a task with weights), exported as a torch op, matches the reference
  eagerly and inside torch.compile(fullgraph=True): one graph, no break.

Writes bench-evaluate-gpu.{json,md}, bench-evaluate-gpu-report/ and bench-evaluate-gpu-export/ into
the results folder. (tests/test_bench_gpu.py is the quick in-process check of the same path.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cutegen import bench
from cutegen.cli import env as cli_env
from cutegen.runtime import find_cutlass_include
from cutegen.tasks import load_tasks
from results_table import ResultsTable
from test_bench_candidates import expectation

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
CANDIDATES = REPO / "tests" / "fixtures" / "bench_candidates"
SIX = "conv2d,layer_norm,linear_gelu,matmul,row_softmax,swish_scale"
RUN_ID = "bench-evaluate"

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]


def _cutegen(args: list[str], work: Path, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cutegen", *args], cwd=work, env=_environment(work), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s)


def _environment(work: Path) -> dict[str, str]:
    """cutegen from this checkout, caches in `work`, and the CUTLASS headers the runtime uses also given to
    exported files (their load_inline build looks there)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160", "TORCH_EXTENSIONS_DIR": str(work / "torch_extensions"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}
    env.setdefault("CUTEGEN_CACHE", str(work / "cache"))
    env["CUTEGEN_CUTLASS_INCLUDE"] = str(find_cutlass_include(cli_env.runtime_config()))
    return env


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench-evaluate")


@pytest.fixture(scope="module")
def table(results_dir) -> ResultsTable:
    return ResultsTable(results_dir, "bench-evaluate-gpu", "cutegen bench --evaluate and export on the GPU",
                        ["file", "expected", "got", "failure", "speedup_vs_eager", "speedup_vs_compile", "sol_fraction",
                         "status"])


@pytest.fixture(scope="module")
def run(work, table, results_dir) -> dict[tuple[str, int], dict[str, Any]]:
    """The bench over the candidate folder, once; its results by (task, sample), and its report kept."""
    done = _cutegen(["bench", str(TASKS), "--select", SIX, "--evaluate", str(CANDIDATES), "--backend", "cute",
                     "--device", "cuda", "--runs-dir", str(work / "runs"), "--run-id", RUN_ID, "--no-report"], work, 540)
    table.set("cli", {"exit": done.returncode, "output_tail": done.stdout[-3000:]})
    results = work / "runs" / RUN_ID / "results.json"
    assert results.is_file(), done.stdout[-3000:]
    data = json.loads(results.read_text())
    table.set("summary", data["summary"])
    report = _cutegen(["report", str(work / "runs" / RUN_ID), "--out", str(results_dir / "bench-evaluate-gpu-report")],
                      work, 120)
    table.set("report", {"exit": report.returncode, "output_tail": report.stdout[-1500:]})
    return {(r["task_id"], r["sample_id"]): r for r in data["results"]}


def _files() -> dict[str, tuple[str, int]]:
    found, _ = bench.find_candidates(load_tasks(TASKS, SIX), CANDIDATES)
    return {path.name: key for key, path in found.items()}


FILES = _files()


@pytest.mark.parametrize("name", sorted(FILES))
def test_each_candidate_file_gets_the_verdict_it_names(name, run, table):
    stage, failures = expectation(CANDIDATES / name)
    result = run.get(FILES[name])
    got = None if result is None else "pass" if result["correctness"] else result["stage_reached"]
    ok = got == stage and (not failures or result["failure"] in failures)
    table.add({"file": name, "expected": stage + (f" ({'|'.join(sorted(failures))})" if failures else ""), "got": got,
               **{k: (result or {}).get(k) for k in ("failure", "speedup_vs_eager", "speedup_vs_compile", "sol_fraction")},
               "status": "OK" if ok else "NOT-OK"})
    assert ok, (got, result)


def _export(work: Path, task: str, fmt: str, results_dir: Path) -> Path:
    target = results_dir / "bench-evaluate-gpu-export" / f"{task}{'_op' if fmt == 'torch-op' else ''}.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    done = _cutegen(["export", str(work / "runs" / RUN_ID), task, "--format", fmt, "--out", str(target), "--force"],
                    work, 60)
    assert done.returncode == 0 and target.is_file(), done.stdout[-2000:]
    return target


def _check(code: str, target: Path, task: str, work: Path, timeout_s: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code, str(target), str(TASKS / f"{task}.py"), "cuda"], cwd=work,
                          env=_environment(work), capture_output=True, text=True, timeout=timeout_s)
    found = re.findall(r"^RESULT (.*)$", done.stdout, flags=re.M)
    assert found, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(found[-1])


KERNELBENCH_CHECK = textwrap.dedent("""
    import json, sys, time, torch
    path, task_path, device = sys.argv[1], sys.argv[2], sys.argv[3]
    ref_ns, context = {}, {}
    exec(compile(open(task_path).read(), task_path, "exec"), ref_ns)
    source = open(path).read()
    started = time.perf_counter()
    exec(compile(source, path, "exec"), context)   # KernelBench-style loading: exec, then take ModelNew
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    ref = ref_ns["Model"](*ref_ns["get_init_inputs"]()).to(device)
    torch.manual_seed(0)
    new = context["ModelNew"](*ref_ns["get_init_inputs"]()).to(device)
    errors, close = [], []
    with torch.no_grad():
        for seed in range(3):
            torch.manual_seed(100 + seed)
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ref_ns["get_inputs"]()]
            out, want = new(*inputs), ref(*inputs)
            torch.cuda.synchronize()
            errors.append(float((out - want).abs().max()))
            close.append(bool(torch.allclose(out, want, atol=1e-4, rtol=1e-4)))
    print("RESULT " + json.dumps({"max_abs_error": max(errors), "first_call_s": time.perf_counter() - started,
                                  "standalone": "from cutegen" not in source and "import cutegen" not in source,
                                  "uses_load_inline": "load_inline(" in source, "close": all(close)}))
""")


def test_the_kernelbench_export_loads_as_kernelbench_loads_it(run, work, table, results_dir):
    target = _export(work, "swish_scale", "kernelbench", results_dir)
    found = _check(KERNELBENCH_CHECK, target, "swish_scale", work, 300)  # load_inline compiles torch's headers
    table.set("kernelbench_export", found)
    assert found["close"] and found["standalone"] and found["uses_load_inline"], found


TORCH_OP_CHECK = textwrap.dedent("""
    import importlib.util, json, sys, torch
    path, task_path, device = sys.argv[1], sys.argv[2], sys.argv[3]
    ref_ns = {}
    exec(compile(open(task_path).read(), task_path, "exec"), ref_ns)
    spec = importlib.util.spec_from_file_location("exported_op", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    ref = ref_ns["Model"](*ref_ns["get_init_inputs"]()).to(device)
    torch.manual_seed(0)
    op = module.ModelOp(*ref_ns["get_init_inputs"]()).to(device)
    inputs = [x.to(device) for x in ref_ns["get_inputs"]()]
    result = {}
    with torch.no_grad():
        want = ref(*inputs)
        result["eager_max_abs_error"] = float((op(*inputs) - want).abs().max())
        explain = torch._dynamo.explain(op)(*inputs)
        result["graphs"], result["graph_breaks"] = explain.graph_count, explain.graph_break_count
        torch._dynamo.reset()
        compiled = torch.compile(op, fullgraph=True)
        result["compiled_max_abs_error"] = float((compiled(*inputs) - want).abs().max())
        torch.manual_seed(7)
        other = [x.to(device) for x in ref_ns["get_inputs"]()]
        result["compiled_fresh_inputs_max_abs_error"] = float((compiled(*other) - ref(*other)).abs().max())
    result["close"] = max(result["eager_max_abs_error"], result["compiled_max_abs_error"],
                          result["compiled_fresh_inputs_max_abs_error"]) <= 1e-3
    print("RESULT " + json.dumps(result))
""")


def test_the_torch_op_export_runs_inside_torch_compile_fullgraph(run, work, table, results_dir):
    target = _export(work, "linear_gelu", "torch-op", results_dir)
    found = _check(TORCH_OP_CHECK, target, "linear_gelu", work, 240)
    table.set("torch_op_export", found)
    assert found["close"] and found["graphs"] == 1 and found["graph_breaks"] == 0, found
