"""The fork server of CPU workers (cutegen/evaluate/zygote.py): a forked worker sees what a spawned one
would (its own session, folder, TMPDIR and allow-listed environment, no descriptor but its channel and stdio), its
exit is reported as Popen would report it, a start-up environment of its own gets a zygote of its own,
and nothing is left running when the parent dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutegen.evaluate.worker import Worker
from cutegen.evaluate.zygote import Zygote

REPO = Path(__file__).resolve().parents[1]

# Run by the worker's "prebuild" command, which executes a module's source: the error it raises carries
# what the worker sees back to the test.
PROBE = """
import json, os, sys, tempfile
sockets = []
for fd in os.listdir("/proc/self/fd"):
    try:
        if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
            sockets.append(int(fd))
    except OSError:
        pass
raise RuntimeError("SEEN" + json.dumps({"pid": os.getpid(), "sid": os.getsid(0), "cwd": os.getcwd(),
    "tmp": tempfile.gettempdir(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "sockets": sockets,
    "path": sys.path, "marker": os.environ.get("LC_CUTEGEN_ZYGOTE_TEST")}))
"""


def seen(worker: Worker) -> dict:
    reply = worker.call("prebuild", {"source": PROBE}, timeout_s=60)
    assert not reply["ok"], reply
    message = reply["error"]["message"]
    return json.loads(message[message.index("SEEN") + 4:].splitlines()[0].rstrip("'\""))


def test_a_forked_worker_sees_what_a_spawned_one_would(monkeypatch):
    monkeypatch.setenv("LC_CUTEGEN_ZYGOTE_TEST", "first")
    zygote = Zygote()
    workers = []
    try:
        workers = [Worker("cpu", None, 4096, warm_profiler=False, zygote=zygote) for _ in range(2)]
        views = [seen(w) for w in workers]
        for worker, view in zip(workers, views):
            assert view["pid"] == worker.process.pid and view["sid"] == view["pid"]  # a session of its own
            assert view["cwd"] == view["tmp"] == str(worker.workdir)
            assert view["cuda"] == "" and view["marker"] == "first"
            assert len(view["sockets"]) == 1  # its channel: not the zygote's, nor another worker's
            assert view["path"][0] == view["cwd"]  # its own folder first on sys.path, not the zygote's
        assert views[0]["cwd"] != views[1]["cwd"]
        workers[0].kill()
        assert workers[0].process.returncode == -signal.SIGKILL
        assert workers[1].process.poll() is None
        # What only an interpreter's start reads (sys.path from PYTHONPATH) asks for a zygote of its own.
        extra = str(REPO / "tests")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (extra, os.environ.get("PYTHONPATH")))))
        monkeypatch.setenv("LC_CUTEGEN_ZYGOTE_TEST", "second")
        workers.append(Worker("cpu", None, 4096, warm_profiler=False, zygote=zygote))
        view = seen(workers[-1])
        assert extra in view["path"] and view["marker"] == "second"
        assert extra not in seen(workers[1])["path"]
        assert len(zygote._servers) == 2
    finally:
        for worker in workers:
            worker.close()
        zygote.close()


def test_a_fork_server_that_cannot_start_says_why(tmp_path, monkeypatch):
    from cutegen.errors import ToolchainError

    (tmp_path / "torch.py").write_text("raise ImportError('no torch in this folder')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    zygote = Zygote()
    try:
        with pytest.raises(ToolchainError, match="no torch in this folder") as err:
            Worker("cpu", None, 4096, warm_profiler=False, zygote=zygote)
        assert "fork_server=False" in err.value.fix
    finally:
        zygote.close()


PARENT = """
import os, signal, sys, time
from cutegen.evaluate.worker import Worker
from cutegen.evaluate.zygote import Zygote
zygote = Zygote()
worker = Worker("cpu", None, 4096, warm_profiler=False, zygote=zygote)
worker.wait_ready(timeout_s=120)
server = next(iter(zygote._servers.values()))
print(server._process.pid, worker.process.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_nothing_is_left_running_when_the_parent_is_killed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO / "src"), os.environ.get("PYTHONPATH"))))}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env)
    try:
        zygote_pid, worker_pid = (int(x) for x in parent.stdout.readline().split())
        assert _alive(zygote_pid) and _alive(worker_pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while (_alive(zygote_pid) or _alive(worker_pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(zygote_pid) and not _alive(worker_pid)
    finally:
        parent.kill()


@pytest.mark.parametrize("fork_server", [True, False])
def test_an_evaluator_judges_alike_with_and_without_the_fork_server(fork_server, tmp_path):
    """The verdicts of an honest candidate and of one that aborts its worker, forked or spawned."""
    from cutegen.config import EvalConfig
    from cutegen.evaluate.pipeline import evaluate_candidate
    from cutegen.evaluate.service import Evaluator
    from cutegen.tasks import load_task

    config = EvalConfig(device="cpu", backend="torch", do_timing=False, cache_dir=tmp_path / "eval",
                        run_timeout_s=120.0)
    task = load_task(REPO / "examples" / "tasks" / "swish_scale.py")
    with Evaluator("cpu", fork_server=fork_server) as service:
        assert (service.zygote is not None) == fork_server
        honest = evaluate_candidate(REPO / "tests" / "fixtures" / "honest" / "swish_scale.py", task, config, service)
        crash = evaluate_candidate(REPO / "tests" / "fixtures" / "faults" / "abort.py", task, config, service)
    assert honest.passed, honest.feedback
    assert crash.failure == "worker_crashed" and "SIGABRT" in crash.feedback
