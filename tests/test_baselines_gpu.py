"""Inputs and baselines on a CUDA device: the task's inputs are drawn by the device's generator (a
task whose get_inputs cannot run there is drawn on the host), the compiled baseline is timed with no
compile worker process alive, and one worker measures task after task."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu]


def _module(get_inputs):
    return types.SimpleNamespace(get_inputs=get_inputs)


def test_inputs_are_drawn_on_the_device_and_kept_on_the_host():
    import torch

    from cutegen.evaluate.correctness import make_inputs

    seen = []

    def get_inputs():
        x = torch.randn(1024, 1024)
        seen.append(x.device.type)
        return [x, 3]

    first = make_inputs(_module(get_inputs), 7, None, torch.device("cuda", 0))
    again = make_inputs(_module(get_inputs), 7, None, torch.device("cuda", 0))
    other = make_inputs(_module(get_inputs), 8, None, torch.device("cuda", 0))
    assert seen == ["cuda"] * 3
    assert first[0].device.type == "cpu" and first[1] == 3
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])
    heavy = make_inputs(_module(get_inputs), 7, (64.0, 4.0), torch.device("cuda", 0))
    assert heavy[0].device.type == "cpu" and heavy[0].abs().max() > 4 * first[0].abs().max()


def test_a_task_whose_inputs_need_the_host_is_drawn_there():
    import torch

    from cutegen.evaluate.correctness import make_inputs

    def get_inputs():  # numpy needs a host tensor
        return [torch.from_numpy(torch.rand(64, 64).numpy() * 2.0)]

    inputs = make_inputs(_module(get_inputs), 7, None, torch.device("cuda", 0))
    torch.manual_seed(7)
    assert torch.equal(inputs[0], get_inputs()[0])


def _children() -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        text = (task / "children").read_text() if (task / "children").exists() else ""
        found |= {int(p) for p in text.split()}
    return found


def test_the_compiled_baseline_is_timed_with_no_compile_workers_alive(monkeypatch):
    pytest.importorskip("triton")  # inductor starts its compile workers only for triton
    import torch

    from cutegen.evaluate import timing

    before = _children()
    alive: list[set[int]] = []
    timed = timing.time_forward

    def spy(*args, **kwargs):
        alive.append(_children() - before)
        return timed(*args, **kwargs)

    monkeypatch.setattr(timing, "time_forward", spy)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()).cuda()
    sets = [[torch.randn(64, 256, device="cuda")]]
    compiled, error = timing.compile_reference(model, sets)
    assert error is None
    times = timing.time_baseline(compiled, sets, torch.device("cuda", 0), {"trials": 5, "warmup": 2})
    assert len(times) == 5 and alive == [set()]


def test_one_baseline_worker_measures_two_tasks_and_frees_the_device_between_them(tmp_path):
    pytest.importorskip("triton")
    from cutegen.config import EvalConfig
    from cutegen.evaluate.baselines import BaselineWorker, get_baselines
    from cutegen.evaluate.worker import WorkerPool
    from cutegen.tasks import load_task

    tasks = Path(__file__).resolve().parents[1] / "examples" / "tasks"
    config = EvalConfig(device="cuda", cache_dir=tmp_path, timing_trials=10, warmup_trials=2)
    with WorkerPool("cuda", warm_profiler=False, warm_compile=True) as pool, BaselineWorker(pool) as held:
        first = get_baselines(load_task(tasks / "matmul.py"), config, pool, held)  # cuBLAS: its workspace
        worker = held.worker
        second = get_baselines(load_task(tasks / "swish_scale.py"), config, pool, held)
        # still held: its release found no device memory left allocated by the first task
        assert held.worker is worker and (first.worker_job, second.worker_job) == (1, 2)
    for measured in (first, second):
        assert measured.eager.median_ms > 0 and measured.compile_error is None, measured.compile_error
        assert measured.compiled.median_ms > 0
