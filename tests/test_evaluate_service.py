"""The evaluation service on CPU: a task's reference work is done once and serves its later
candidates; builds run in the CPU pool beside a held GPU lane; outputs cross between the candidate's
process and the reference process only as the candidate's exports; a task whose inputs cannot be
drawn again from their seed is the task's error."""

from __future__ import annotations

import textwrap
import threading
from types import SimpleNamespace
from pathlib import Path

import pytest

from cutegen.config import EvalConfig, RuntimeConfig
from cutegen.errors import TaskError
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.service import Evaluator, driver_use
from cutegen.tasks import load_task

from helpers import needs_nvcc

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
HONEST = REPO / "tests" / "fixtures" / "honest"


def config(tmp_path: Path, **over) -> EvalConfig:
    fields = dict(device="cpu", backend="torch", do_timing=False, cache_dir=tmp_path / "eval", run_timeout_s=120.0,
                  correctness_trials=2, adversarial_trials=1, weight_seeds=1)
    fields.update(over)
    return EvalConfig(**fields)


SLOW_IMPORT = """
import time

time.sleep({sleep})  # imported in the build pool (its source names load_inline): a long build stand-in
"""


def test_a_tasks_reference_is_prepared_while_its_first_candidate_builds_and_reused_by_the_next(tmp_path):
    """The reference work (reference process, trials, probe) runs on the idle lane while the first
    candidate builds; that evaluation finds it ready and counts the lane seconds it took as its own
    (`prepared`, in gpu_s); the task's next candidate reuses the same process and reports none of
    it; another task gets its own."""
    cfg = config(tmp_path)
    task = load_task(TASKS / "swish_scale.py")
    slow = tmp_path / "slow_build.py"
    slow.write_text(SLOW_IMPORT.format(sleep=2) + (HONEST / "swish_scale.py").read_text())
    with Evaluator("cpu", prepare_ahead=True) as service:
        first = evaluate_candidate(slow, task, cfg, service)
        (lane,) = service.lanes
        (ref,) = lane.references.values()
        pid = ref.worker.process.pid
        second = evaluate_candidate(HONEST / "swish_scale.py", task, cfg, service)
        timeline = list(service.timeline)
        assert first.passed and second.passed, (first.feedback, second.feedback)
        assert first.candidate_sha256 != second.candidate_sha256
        (again,) = lane.references.values()
        assert again is ref and again.worker.process.pid == pid and again.evaluations == 2
        other = evaluate_candidate(HONEST / "row_softmax.py", load_task(TASKS / "row_softmax.py"), cfg, service)
        assert other.passed and "reference" in dict(other.stage_s) and len(lane.references) == 2
    (prepare,) = [(start, end) for what, _, start, end in timeline if what == "prepare"]
    build = [(start, end) for what, _, start, end in timeline if what == "build"][0]
    first_lane = [(start, end) for what, _, start, end in timeline if what == "lane"][0]
    assert prepare[0] < build[1] and prepare[1] <= first_lane[0], timeline  # beside the build, before the lane
    steps = dict(first.stage_s)
    assert {"reference", "prepared"} <= set(steps) and steps["prepared"] >= steps["reference"] > 0
    assert first.gpu_s >= steps["prepared"] + (first_lane[1] - first_lane[0]) - 0.05
    assert not {"reference", "prepared"} & set(dict(second.stage_s))


def test_the_candidates_worker_holds_no_reference_output(tmp_path):
    """A candidate that returns the first tensor of the output's shape it finds on the Python heap
    (other than its input) got the reference's result when reference outputs lived in its process;
    now it finds only its own tensors and fails the comparison (fixture 40_heap_reference). The
    worker's audit hook refuses the heap walk first; judged with the hook off, this shows the layer
    behind it."""
    from dataclasses import replace

    path = REPO / "tests" / "fixtures" / "cheats" / "40_heap_reference.py"
    guarded = evaluate_candidate(path, load_task(TASKS / "swish_scale.py"), config(tmp_path))
    assert guarded.failure == "guard_refused", guarded.feedback
    verdict = evaluate_candidate(path, load_task(TASKS / "swish_scale.py"), replace(config(tmp_path), guard=False))
    assert verdict.failure == "compare_outputs", verdict.feedback
    assert verdict.errors.mismatched_elements > 0


UNSEEDED_TASK = '''
import os

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0


def get_inputs():
    # drawn from the OS, not from the seeded generators: another draw is another input
    return [torch.frombuffer(bytearray(os.urandom(4 * 64)), dtype=torch.float32).clone().nan_to_num(0.0)]


def get_init_inputs():
    return []
'''

DOUBLER = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2.0
'''


def test_inputs_that_do_not_follow_their_seed_are_the_tasks_error(tmp_path):
    (tmp_path / "unseeded.py").write_text(UNSEEDED_TASK)
    (tmp_path / "doubler.py").write_text(DOUBLER)
    with pytest.raises(TaskError, match="differ from the reference's draw"):
        evaluate_candidate(tmp_path / "doubler.py", load_task(tmp_path / "unseeded.py"), config(tmp_path))


SLOW_BUILD = '''
import time

import torch
import torch.nn as nn

from cutegen.runtime import CuteKernel

time.sleep({sleep})  # the import is part of the build: here it stands for a long compile
kernel = CuteKernel(r"""
#include <cuda_runtime.h>
__global__ void noop_kernel() {{}}
extern "C" int noop(cudaStream_t stream) {{ noop_kernel<<<1, 1, 0, stream>>>(); return int(cudaGetLastError()); }}
""", {{"noop": ()}}, name="noop_{tag}")


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * torch.sigmoid(x) * self.scale
'''


@needs_nvcc
def test_builds_run_in_the_cpu_pool_while_another_candidate_holds_the_lane(tmp_path):
    """The candidates declare a kernel (compiled for sm_90a on this GPU-less machine): the quick one
    builds, then holds the lane for its evaluation while the slow one still builds in the pool."""
    pytest.importorskip("cutlass_library")
    cfg = config(tmp_path, runtime=RuntimeConfig(cache_dir=tmp_path / "build", arch="sm_90a"), build_timeout_s=300.0)
    task = load_task(TASKS / "swish_scale.py")
    quick, slow = tmp_path / "quick.py", tmp_path / "slow.py"
    quick.write_text(textwrap.dedent(SLOW_BUILD.format(sleep=0, tag="quick")))
    slow.write_text(textwrap.dedent(SLOW_BUILD.format(sleep=6, tag="slow")))
    verdicts = {}
    with Evaluator("cpu", build_jobs=2) as service:
        threads = [threading.Thread(target=lambda p=p: verdicts.update({p.stem: evaluate_candidate(p, task, cfg, service)}))
                   for p in (quick, slow)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        timeline = list(service.timeline)
    assert all(v.passed for v in verdicts.values()), {k: v.feedback for k, v in verdicts.items()}
    builds = [(start, end) for what, _, start, end in timeline if what == "build"]
    lanes = [(start, end) for what, _, start, end in timeline if what == "lane"]
    assert len(builds) == 2 and len(lanes) == 2
    assert any(b0 < l1 and l0 < b1 for b0, b1 in builds for l0, l1 in lanes), timeline
    assert all("build_pool" in dict(v.stage_s) for v in verdicts.values())


def test_reference_work_ahead_waits_for_no_evaluation_and_closes_no_reference(monkeypatch):
    """A request waits while an evaluation holds the lane or waits for one; it is dropped once its
    task's evaluation waits (that evaluation does the work); a lane prepares only what fits beside
    the references it holds. No process is started (Lane.prepare and the lane's references are
    stand-ins)."""
    import time
    from types import SimpleNamespace

    from cutegen.evaluate import service as service_module
    from cutegen.evaluate.service import Lane

    service = Evaluator("cpu", prepare_ahead=True)
    lane = service.lanes[0]
    prepared: list[str] = []
    monkeypatch.setattr(Lane, "prepare", lambda self, task, config:
                        prepared.append((task.task_id, dict(service._waiting))) or True)
    monkeypatch.setattr(service_module, "reference_key", lambda task, config: (task.task_id, task.source_sha256))
    task = {name: SimpleNamespace(task_id=name, source_sha256="sha-" + name) for name in ("a", "b", "c")}

    def settle_until(predicate, seconds: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        while not predicate() and time.monotonic() < deadline:
            time.sleep(0.01)

    with service.lane(task["a"]):
        service.prepare(task["b"], None)
        service.prepare(task["b"], None)  # asked twice, prepared once
        service.prepare(task["c"], None)
        time.sleep(0.2)
        assert prepared == []  # the lane is held
        entered = threading.Event()

        def evaluate_c() -> None:
            entered.set()
            with service.lane(task["c"]):
                time.sleep(0.2)

        waiter = threading.Thread(target=evaluate_c, daemon=True)
        waiter.start()
        entered.wait()
        time.sleep(0.05)
    waiter.join(timeout=10)
    settle_until(lambda: len(prepared) >= 1)
    time.sleep(0.2)
    # b once no evaluation waited; c's request was dropped when its own evaluation asked for the lane
    assert prepared == [("b", {})]
    service.close()
    service.prepare(task["a"], None)
    assert prepared == [("b", {})]  # nothing after close

    # What fits: a CPU lane keeps CPU_LANE_REFERENCES processes; a GPU lane REFERENCE_MEMORY_FRACTION
    # of the device's memory, without closing any it holds.
    monkeypatch.undo()
    gib = 1 << 30
    lane = Evaluator("cpu").lanes[0]
    started: list[str] = []
    monkeypatch.setattr(lane, "ready_reference", lambda task, config: started.append(task.task_id) or
                        SimpleNamespace(seconds={"reference": 1.0}))
    for k in range(service_module.CPU_LANE_REFERENCES):
        lane.references[("held", k)] = SimpleNamespace(memory_bytes=0)
    cfg = EvalConfig(device="cpu", backend="torch")
    assert not lane.prepare(load_task(TASKS / "swish_scale.py"), cfg) and started == []
    lane.evaluator.device = "cuda"  # what prepare asks; nothing here touches a device
    monkeypatch.setattr(lane.pool, "info", lambda: {"total_memory": 100 * gib})
    monkeypatch.setattr(service_module, "_reference_bytes", lambda task, config: 20 * gib)
    lane.references.clear()
    lane.references[("held", 0)] = SimpleNamespace(memory_bytes=31 * gib)  # 31 + 20 > 50
    assert not lane.prepare(load_task(TASKS / "swish_scale.py"), cfg) and started == []
    lane.references[("held", 0)].memory_bytes = 30 * gib
    assert lane.prepare(load_task(TASKS / "swish_scale.py"), cfg) and started == ["swish_scale"]
    assert list(lane.references) == [("held", 0)]  # the stand-in ready_reference keeps nothing; none closed


def test_exported_outputs_open_in_another_process_only_as_described(tmp_path):
    import torch

    from cutegen.evaluate.transfer import TransferError, export_outputs, open_outputs

    out = (torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), torch.tensor([1, 2], dtype=torch.int64))
    descriptor, keep = export_outputs(list(out), tmp_path)
    expected = [{"dtype": "float32", "shape": [4, 3]}, {"dtype": "int64", "shape": [2]}]
    with open_outputs(descriptor, expected, torch.device("cpu")) as opened:
        assert torch.equal(opened[0], out[0]) and torch.equal(opened[1], out[1])
    with pytest.raises(TransferError, match="the reference's float32"):
        with open_outputs(descriptor, [{"dtype": "float32", "shape": [3, 4]}, expected[1]], torch.device("cpu")):
            pass
    forged = {"leaves": [dict(descriptor["leaves"][0], bytes=4), descriptor["leaves"][1]]}
    with pytest.raises(TransferError, match="shorter"):
        with open_outputs(forged, expected, torch.device("cpu")):
            pass


def test_a_full_disk_is_a_transfer_space_error_and_an_infrastructure_verdict(tmp_path, monkeypatch):
    """An output file's room is reserved before it is mapped: where the disk is full, the export
    raises TransferSpaceError (a bus error when a mapped page of a sparse file is written would end
    the worker and blame the candidate), which the parent reports as not the candidate's fault."""
    import errno
    import os

    import torch

    from cutegen.evaluate import transfer
    from cutegen.evaluate.failure import classify_error
    from cutegen.evaluate.pipeline import _Calls
    from cutegen.evaluate.verdict import Stop, VerdictBuilder, error_failure

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(transfer.os, "posix_fallocate", full)
    with pytest.raises(transfer.TransferSpaceError, match="no room for a") as raised:
        transfer.export_outputs([torch.ones(4)], tmp_path, via="file")
    assert list(tmp_path.iterdir()) == []  # the reserved-for file is gone
    assert classify_error(raised.value, str(raised.value)) == "transfer_space"
    name, feedback = error_failure({"kind": "transfer_space", "type": "TransferSpaceError",
                                    "message": str(raised.value)}, "ghost")
    assert name == "transfer_space" and feedback.startswith("Not a verdict on the candidate")

    worker = SimpleNamespace(call=lambda *a, **k: {"ok": False, "error": {"kind": "transfer_space",
                                                                           "type": "TransferSpaceError",
                                                                           "message": str(raised.value)}})
    run = VerdictBuilder("t", "sha", EvalConfig(device="cpu", backend="torch"))
    with pytest.raises(Stop):
        _Calls(run, worker, EvalConfig(device="cpu", backend="torch"))("ghost_run", {})
    assert run.failure == "transfer_space" and run.fields.get("infrastructure") is True


def test_only_a_cuda_ipc_failure_sends_the_outputs_again_as_files(monkeypatch):
    """The reference's `IpcOpenError` makes the candidate's worker export the same outputs as files;
    the evaluator's later candidates export files from the start only where IPC never worked here.
    Any other failure of the reference (out of memory, say) is not a reason to switch: it stays a
    failure of that comparison, the infrastructure verdict `reference_failed` (on the H200 it had
    ended a whole `cutegen bench` run as an exception)."""
    from cutegen.evaluate.pipeline import _ReferenceCalls
    from cutegen.evaluate.verdict import Stop, VerdictBuilder

    service = Evaluator("cpu")
    lane = service.lanes[0]
    dropped: list[bool] = []
    monkeypatch.setattr(lane, "drop", lambda ref: dropped.append(True))
    ipc = {"outputs": {"leaves": [{"kind": "cuda_ipc"}], "group": 0}}
    reexported: list[dict] = []

    def candidate_call(command, payload, step=None):
        reexported.append(payload)
        return {"leaves": [{"kind": "file"}], "group": payload["group"]}

    def calls(first_error: str | None):
        replies = ([{"ok": False, "error": {"type": first_error, "message": "it failed"}}] if first_error else []) \
            + [{"ok": True, "data": {"errors": []}}]
        sent: list[dict] = []

        def send(self, command, payload, step):
            sent.append(payload)
            return replies[len(sent) - 1]

        monkeypatch.setattr(_ReferenceCalls, "_send", send)
        ref = SimpleNamespace(memory_bytes=0)
        return _ReferenceCalls(run, lane, ref, None, candidate_call), sent

    run = VerdictBuilder("t", "sha", EvalConfig(device="cpu", backend="torch"))
    call, sent = calls("OutOfMemoryError")
    with pytest.raises(Stop):
        call("compare", ipc)
    assert not reexported and service.transfer == "auto" and dropped == [True]
    assert run.failure == "reference_failed" and run.fields.get("infrastructure") is True
    assert "Not a verdict on the candidate" in run.feedback and "OutOfMemoryError" in run.feedback

    call, sent = calls("IpcOpenError")  # IPC never worked in this evaluator: files from now on
    assert call("compare", ipc) == {"errors": []}
    assert len(reexported) == 1 and sent[1]["outputs"]["leaves"][0]["kind"] == "file"
    assert service.transfer == "file"

    service.transfer, service.ipc_worked = "auto", False
    call, sent = calls(None)
    call("compare", ipc)
    assert service.ipc_worked  # an opened IPC export: it works here
    call, sent = calls("IpcOpenError")  # works here, so this candidate's handle was the problem
    assert call("compare", ipc) == {"errors": []}
    assert len(reexported) == 2 and service.transfer == "auto"

    # A timed output's comparison first has the candidate's worker give back its cached blocks, once.
    dropped.clear()
    made_room: list[bool] = []
    call, sent = calls("OutOfMemoryError")
    assert call("compare_fresh", ipc, room=lambda: made_room.append(True)) == {"errors": []}
    assert made_room == [True] and len(sent) == 2 and not dropped


def test_a_freed_lane_prefers_the_held_task_but_never_starves_another():
    """Evaluations of the task whose reference the lane holds go first, as long as the oldest waiter
    has been passed over fewer than MAX_PASSED_OVER times; no process is started (the lane's
    references are set by hand)."""
    import time
    from types import SimpleNamespace

    from cutegen.evaluate.service import MAX_PASSED_OVER

    service = Evaluator("cpu")
    lane = service.lanes[0]
    order: list[str] = []
    lock = threading.Lock()

    def evaluate(task_id: str, label: str, entered: threading.Event) -> None:
        task = SimpleNamespace(task_id=task_id, source_sha256="sha-" + task_id)
        entered.set()
        with service.lane(task) as held:
            with lock:
                order.append(label)
            held.references.clear()
            held.references[(task_id, task.source_sha256, "settings")] = None  # this task's reference is kept

    def start(task_id: str, label: str) -> threading.Thread:
        entered = threading.Event()
        thread = threading.Thread(target=evaluate, args=(task_id, label, entered), daemon=True)
        thread.start()
        entered.wait()
        time.sleep(0.05)  # tickets follow the start order
        return thread

    with service.lane(SimpleNamespace(task_id="held", source_sha256="sha-held")):
        lane.references[("held", "sha-held", "settings")] = None
        threads = [start("other", "other")] + [start("held", f"held{i}") for i in range(MAX_PASSED_OVER + 3)]
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    # The held task's candidates follow each other, the older waiter goes once it was passed over
    # MAX_PASSED_OVER times, and its task is then the held one.
    assert order.index("other") == MAX_PASSED_OVER
    assert order[:MAX_PASSED_OVER] == [f"held{i}" for i in range(MAX_PASSED_OVER)]


def test_a_candidate_gets_room_from_other_tasks_references_and_the_last_candidates_worker(monkeypatch):
    """Other tasks' reference processes are closed, least recently used first, until they, this
    task's and what the candidate needs fit in the GPU's memory; the last candidate's worker is
    waited for when two candidates would not fit side by side; this task's reference stays. A
    reference's size is what its latest reply reported (it grows as it serves candidates). No
    process is started (the lane's references and the device's memory are set by hand)."""
    from types import SimpleNamespace

    from cutegen.evaluate import service as service_module
    from cutegen.evaluate.pipeline import _ReferenceCalls
    from cutegen.evaluate.service import ReferenceProcess

    gib = 1 << 30
    service = Evaluator("cpu")
    service.device = "cuda"  # what candidate_room asks; nothing here touches a device
    lane = service.lanes[0]
    closed: list[str] = []
    waited: list[bool] = []
    monkeypatch.setattr(lane.pool, "info", lambda: {"total_memory": 100 * gib})
    monkeypatch.setattr(lane.pool, "wait_closed", lambda: waited.append(True))

    def held(name: str, size_gib: int) -> ReferenceProcess:
        worker = SimpleNamespace(close=lambda: closed.append(name))
        ref = ReferenceProcess((name,), worker, {}, {}, (), memory_bytes=size_gib * gib)
        lane.references[ref.key] = ref
        return ref

    def room(need_gib: int, current: ReferenceProcess) -> None:
        monkeypatch.setattr(service_module, "_candidate_bytes", lambda task, config: need_gib * gib)
        lane.candidate_room(SimpleNamespace(), None, current)

    held("oldest", 40), held("older", 30)
    current = held("current", 20)
    room(25, current)  # 90 + 25 > 100: the oldest goes; 50 + 25 fits, and so do two candidates
    assert closed == ["oldest"] and not waited and list(lane.references) == [("older",), ("current",)]
    room(35, current)  # 50 + 35 fits, two candidates (50 + 70) do not: wait for the last one's end
    assert closed == ["oldest"] and waited == [True]

    # The current reference reports 75 GB after serving candidates: now the other one must go too,
    # and the current one stays even where nothing else is left to close.
    monkeypatch.setattr(_ReferenceCalls, "_send", lambda self, *a: {"ok": True, "data": {"memory_bytes": 75 * gib}})
    _ReferenceCalls(None, lane, current, None, None)("compare", {})
    assert current.memory_bytes == 75 * gib
    room(35, current)
    assert closed == ["oldest", "older"] and list(lane.references) == [("current",)]
    room(80, current)
    assert closed == ["oldest", "older"] and list(lane.references) == [("current",)]


def test_room_is_made_first_from_references_no_queued_evaluation_needs(monkeypatch):
    """A reference whose task still has an evaluation waiting for the lane is closed last, even when
    it is the least recently used: closing it would cost its task the reference work again. Within
    each group the least recently used goes first; the current task's reference always stays."""
    from types import SimpleNamespace

    from cutegen.evaluate import service as service_module
    from cutegen.evaluate.service import ReferenceProcess

    gib = 1 << 30
    service = Evaluator("cpu")
    service.device = "cuda"  # what candidate_room asks; nothing here touches a device
    lane = service.lanes[0]
    closed: list[str] = []
    monkeypatch.setattr(lane.pool, "info", lambda: {"total_memory": 100 * gib})
    monkeypatch.setattr(lane.pool, "wait_closed", lambda: None)
    monkeypatch.setattr(service_module, "_candidate_bytes", lambda task, config: 30 * gib)

    def held(name: str, size_gib: int) -> ReferenceProcess:
        worker = SimpleNamespace(close=lambda: closed.append(name))
        ref = ReferenceProcess((name, "sha-" + name, "settings"), worker, {}, {}, (), memory_bytes=size_gib * gib)
        lane.references[ref.key] = ref
        return ref

    held("queued", 30), held("done-a", 20), held("done-b", 20)
    current = held("current", 20)
    service._waiting = {7: ("queued", "sha-queued")}  # a candidate of "queued" waits for the lane
    lane.candidate_room(SimpleNamespace(), None, current)  # 90 + 30 > 100: 20 GB must go
    assert closed == ["done-a"]
    lane.candidate_room(SimpleNamespace(), None, current)  # 70 + 30 fits
    assert closed == ["done-a"]
    monkeypatch.setattr(service_module, "_candidate_bytes", lambda task, config: 60 * gib)
    lane.candidate_room(SimpleNamespace(), None, current)  # 70 + 60: done-b, then the queued task's too
    assert closed == ["done-a", "done-b", "queued"] and list(lane.references) == [current.key]

    # A new reference (`_make_room`) follows the same order.
    closed.clear()
    held("queued", 30), held("done-c", 30)
    monkeypatch.setattr(service_module, "REFERENCE_MEMORY_FRACTION", 0.8)
    lane._make_room(need=20 * gib)  # 80 + 20 > 80: one must go, the least recent of those not queued
    assert closed == ["current"] and ("queued", "sha-queued", "settings") in lane.references


def test_the_candidates_memory_estimate_follows_the_tasks_trace():
    from cutegen.evaluate.service import CANDIDATE_MARGIN_BYTES, _candidate_bytes
    from cutegen.trace import trace_task

    task = load_task(Path(__file__).resolve().parents[1] / "examples/tasks/swish_scale.py")
    config = EvalConfig(device="cpu", backend="torch")
    trace = trace_task(task)
    inputs, outputs = trace.input_bytes, trace.output_bytes
    timing = config.timing_input_sets * inputs + (config.timed_output_checks + 2) * outputs
    assert _candidate_bytes(task, config) == max(2 * inputs + 2 * outputs, timing) + 2 * (trace.param_bytes or 0) \
        + CANDIDATE_MARGIN_BYTES
    assert _candidate_bytes(task, config) > CANDIDATE_MARGIN_BYTES


def test_a_candidate_that_ran_out_of_the_evaluators_memory_is_evaluated_again(monkeypatch):
    """Once, and only when the lane held memory it could give back (Lane.release_memory); the
    verdict says so. Other failures, and running out beside nothing of the evaluator's, stand."""
    from types import SimpleNamespace

    from cutegen.evaluate import pipeline
    from cutegen.evaluate.verdict import VerdictBuilder
    from cutegen.records import CheckResult

    config = EvalConfig(device="cuda", backend="torch")
    task = SimpleNamespace(task_id="t")
    attempts: list[int] = []

    def stages(failures: list[str]):
        def run_stages(run, source, task, config, lane):
            attempts.append(len(attempts))
            if len(attempts) <= len(failures):
                run.fail(failures[len(attempts) - 1], "it failed")
            run.add(CheckResult("timing", "timing", True, "timed"))
        return run_stages

    def judge(failures: list[str], freed: str):
        attempts.clear()
        monkeypatch.setattr(pipeline, "_lane_stages", stages(failures))
        run = VerdictBuilder("t", "sha", config)
        run.add(CheckResult("static", "static", True, "no findings"))
        lane = SimpleNamespace(release_memory=lambda message: (told.append(message), freed)[1])
        return pipeline._lane_attempts(run, "", task, config, lane).verdict()

    told: list[str] = []  # the out-of-memory feedback, which names the device's processes
    verdict = judge(["out_of_memory"], "80.0 GiB in 2 reference process(es)")
    assert verdict.passed and len(attempts) == 2 and told == ["it failed"]
    assert [c.name for c in verdict.checks] == ["static", "memory_retry", "timing"]
    assert "80.0 GiB in 2 reference process(es)" in verdict.checks[1].detail
    verdict = judge(["out_of_memory", "out_of_memory"], "80.0 GiB in 2 reference process(es)")
    assert verdict.failure == "out_of_memory" and len(attempts) == 2  # once only
    verdict = judge(["out_of_memory"], "")
    assert verdict.failure == "out_of_memory" and len(attempts) == 1  # nothing of the evaluator's to free
    verdict = judge(["mismatch"], "80.0 GiB in 2 reference process(es)")
    assert verdict.failure == "mismatch" and len(attempts) == 1


def test_a_lane_gives_back_memory_only_when_it_held_some_a_candidate_could_use(monkeypatch):
    from types import SimpleNamespace

    from cutegen.evaluate.service import ReferenceProcess

    gib = 1 << 30
    lane = Evaluator("cpu").lanes[0]
    closed: list[str] = []

    def held(name: str, size_gib: float, trimmed_gib: float, pid: int = 0) -> None:
        worker = SimpleNamespace(close=lambda: closed.append(name), process=SimpleNamespace(pid=pid))
        lane.references[(name,)] = ReferenceProcess((name,), worker, {}, {}, (), memory_bytes=int(size_gib * gib),
                                                    trimmed_bytes=int(trimmed_gib * gib))

    held("current", 60.5, 60)  # this task's, barely grown: nothing to give back
    assert lane.release_memory() == "" and not closed
    lane.ending_at_start = 1  # the last candidate's worker was still ending
    assert lane.release_memory() == "60.5 GiB in 1 reference process(es) and 1 ending worker(s)"
    assert closed == ["current"] and not lane.references
    lane.ending_at_start = 0
    held("current", 96, 60)  # grown by the ghost probe's forwards
    assert lane.release_memory().startswith("96.0 GiB") and closed == ["current", "current"]
    held("other", 40, 40), held("current", 20, 20)
    assert lane.release_memory() == "60.0 GiB in 2 reference process(es)" and not lane.references
    # Holding more than it reports, by the driver's count in PyTorch's message (on an H200, level1/36's
    # reference was listed with 98.6 GiB beside an honest candidate that ran out; measured alone, the
    # same reference held 49 GiB after its baselines).
    oom = ("CUDA out of memory. Tried to allocate 7.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 4.23"
           " GiB is free. Process 7284 has 98.60 GiB memory in use. Including non-PyTorch memory, this process"
           " has 35.72 GiB memory in use. Process 7454 has 624.00 MiB memory in use.")
    held("current", 49.5, 49, pid=7284)
    assert lane.release_memory(oom) == "98.6 GiB in 1 reference process(es)" and not lane.references
    held("current", 49.5, 49, pid=7454)  # listed within what it reports: nothing to give back
    assert lane.release_memory(oom) == "" and lane.references
    assert driver_use(oom) == {7284: int(98.6 * gib), 7454: 624 << 20}


def test_a_reference_that_holds_far_more_than_it_keeps_after_its_baselines_is_replaced_once(monkeypatch):
    """`trim` reports the process's memory; one far above its trials' outputs, trial 0's inputs and
    its models is closed, and a new process (which finds the baselines in the cache) takes its place,
    once: a second one is kept whatever it holds."""
    from types import SimpleNamespace

    from cutegen.evaluate import service
    from cutegen.evaluate.service import ReferenceProcess

    gib = 1 << 30
    config = EvalConfig(device="cpu", backend="torch")  # 5 trials + 1 heavy-tailed, 2 weight seeds
    monkeypatch.setattr(service, "_trace_bytes", lambda task: (7 * gib, 7 * gib, 0))  # level1/36's sizes
    monkeypatch.setattr(service, "measure_in_reference", lambda *args: (None, None))
    lane = Evaluator("cpu").lanes[0]
    started: list[str] = []
    closed: list[str] = []

    def held_after_trim(*sizes_gib: float):
        sizes = iter(sizes_gib)

        def reference(task, config):
            name = f"process {len(started)}"
            started.append(name)
            size = int(next(sizes) * gib)
            worker = SimpleNamespace(info={}, close=lambda: closed.append(name),
                                     call=lambda command, **kw: {"ok": True, "data": {"memory_bytes": size}})
            ref = ReferenceProcess((name,), worker, {}, {}, (), seconds={"reference": 1.0})
            lane.references[(name,)] = ref
            return ref
        monkeypatch.setattr(lane, "reference", reference)

    task = SimpleNamespace(task_id="level1/36")
    held_after_trim(98.6, 49.0)
    ref = lane.ready_reference(task, config)
    assert started == ["process 0", "process 1"] and closed == ["process 0"]
    assert ref.trimmed_bytes == 49 * gib and ref.seconds["reference"] == 2.0  # both processes' cost
    started.clear(), closed.clear(), lane.references.clear()
    held_after_trim(98.6, 98.6, 98.6)
    assert lane.ready_reference(task, config).trimmed_bytes == int(98.6 * gib)
    assert started == ["process 0", "process 1"] and closed == ["process 0"]  # replaced once only
    started.clear(), closed.clear(), lane.references.clear()
    held_after_trim(52.0)  # 49 GiB kept, allocator rounding: kept
    assert lane.ready_reference(task, config).trimmed_bytes == 52 * gib and closed == []
