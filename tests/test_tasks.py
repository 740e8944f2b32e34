"""Task loading, selectors, hashing and the meta-tensor trace, checked against hand-computed values."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutegen.errors import ConfigError, TaskError
from cutegen.tasks import load_task, load_tasks, select_tasks, source_sha256, task_module
from cutegen.trace import trace_task

GOOD = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return []
'''


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_hash_ignores_line_endings_and_trailing_space():
    assert source_sha256("a = 1\nb = 2\n") == source_sha256("a = 1  \r\nb = 2\r\n\n")
    assert source_sha256("a = 1\n") != source_sha256("a = 2\n")


def test_missing_get_inputs_is_named(tmp_path):
    path = write(tmp_path, "t.py", GOOD.replace("def get_inputs", "def make_inputs"))
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert "get_inputs" in str(err.value) and "Fix:" in str(err.value)


def test_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "t.py", GOOD.replace("return torch.relu(x)", "return torch.relu(x"))
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert "syntax error at line" in str(err.value)


def test_task_that_raises_names_exception_and_line(tmp_path):
    source = GOOD + "\nraise ValueError('broken on purpose')\n"
    raise_line = source.splitlines().index("raise ValueError('broken on purpose')") + 1
    task = load_task(write(tmp_path, "t.py", source))
    with pytest.raises(TaskError) as err:
        task_module(task)
    message = str(err.value)
    assert "ValueError" in message and "broken on purpose" in message and f"line {raise_line}" in message


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(TaskError):
        load_tasks(tmp_path / "nope.py")
    with pytest.raises(TaskError, match="holds no task files"):
        load_tasks(tmp_path)


def test_selectors_on_a_suite_layout(tmp_path):
    for level, ids in ((1, (1, 2, 19, 23)), (2, (1, 5))):
        folder = tmp_path / f"level{level}"
        folder.mkdir()
        for i in ids:
            write(folder, f"{i}_Task{i}.py", GOOD)
    all_tasks = load_tasks(tmp_path)
    assert [t.task_id for t in all_tasks] == ["level1/1", "level1/2", "level1/19", "level1/23", "level2/1", "level2/5"]
    ids = lambda sel: [t.task_id for t in select_tasks(all_tasks, sel)]  # noqa: E731
    assert ids("level1") == ["level1/1", "level1/2", "level1/19", "level1/23"]
    assert ids("level1:2-19") == ["level1/2", "level1/19"]
    assert ids("level1/19,level2/5") == ["level1/19", "level2/5"]
    assert ids("*Task23*") == ["level1/23"]
    with pytest.raises(ConfigError, match="matches no task"):
        select_tasks(all_tasks, "level3")


def test_trace_of_example_tasks_matches_hand_counts(example_tasks):
    traces = {t.task_id: trace_task(t) for t in load_tasks(example_tasks)}
    matmul = traces["matmul"]
    assert matmul.workload_class == "gemm"
    assert matmul.flops == 2 * 512 * 384 * 256
    assert matmul.min_bytes == 4 * (512 * 256 + 256 * 384 + 512 * 384)
    conv = traces["conv2d"]
    assert conv.workload_class == "conv"
    assert conv.flops == 2 * 8 * 32 * 32 * 32 * 16 * 3 * 3  # 2 * N*Cout*H*W * Cin*kh*kw
    assert conv.param_bytes == 4 * (32 * 16 * 9 + 32)
    swish = traces["swish_scale"]
    assert (swish.workload_class, swish.flops) == ("elementwise", 0)
    assert swish.min_bytes == 2 * 4 * 256 * 4096
    assert traces["row_softmax"].workload_class == "reduction"
    assert traces["layer_norm"].workload_class == "norm"
    assert traces["linear_gelu"].workload_class == "fused_chain"
    assert traces["linear_gelu"].anchor_op == "addmm"


def test_tasks_traced_in_threads_at_once_leave_stdout_alone(example_tasks):
    """The agent and the evaluation service trace tasks from several threads; the trace silences
    stdout, which must be the same object afterwards (a lost sys.stdout dropped every later line)."""
    from concurrent.futures import ThreadPoolExecutor

    tasks = load_tasks(example_tasks) * 8
    before = sys.stdout
    with ThreadPoolExecutor(6) as threads:
        traces = list(threads.map(trace_task, tasks))
    assert sys.stdout is before and all(t.error is None for t in traces)


def test_quiet_stdout_silences_only_its_own_thread(capsys):
    """A bench's main thread prints a line per verdict while service threads trace tasks: the
    trace's silence must not swallow the main thread's line (it did with redirect_stdout)."""
    import threading

    from cutegen.trace import quiet_stdout

    inside, release = threading.Event(), threading.Event()

    def quiet() -> None:
        with quiet_stdout(), quiet_stdout():  # nested blocks of one thread
            print("from the quiet thread")
            inside.set()
            release.wait(10)
        print("after the block")

    before = sys.stdout
    thread = threading.Thread(target=quiet, daemon=True)  # a regression that blocks must fail, not hang
    thread.start()
    assert inside.wait(10)
    print("from the main thread")
    release.set()
    thread.join(10)
    assert sys.stdout is before
    out = capsys.readouterr().out
    assert "from the main thread" in out and "after the block" in out and "quiet thread" not in out


def test_trace_failure_is_recorded_not_raised(tmp_path):
    source = GOOD.replace("return torch.relu(x)", "return x * float(x.sum().item())")
    trace = trace_task(load_task(write(tmp_path, "t.py", source)))
    assert trace.error and trace.flops is None and trace.workload_class == "other"


@pytest.mark.kernelbench
def test_kernelbench_level1_listing(kernelbench_root):
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "cutegen", "tasks", str(kernelbench_root), "--select", "level1", "--json"],
        capture_output=True, text=True, check=True,
    )
    elapsed = time.perf_counter() - start
    rows = {row["task_id"]: row for row in json.loads(out.stdout)}
    assert len(rows) == 100
    assert elapsed < 60
    n = 4096  # level1/1 multiplies two N x N matrices with N = 2048 * 2
    assert rows["level1/1"]["workload_class"] == "gemm" and rows["level1/1"]["flops"] == 2 * n**3
    assert rows["level1/19"]["workload_class"] == "elementwise"
    assert all(row["error"] is None for row in rows.values())
