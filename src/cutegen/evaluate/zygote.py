"""A fork server for CPU workers: torch imported once, each worker forked from that clean image.

Every evaluation needs fresh processes (worker.py, "Isolation"), and a fresh Python process spends
about 2 s of CPU importing torch before it can serve. For workers that never touch a GPU (the
confined build workers of every evaluator, and the candidate and reference workers of an evaluator on
the CPU), a zygote process imports torch and the worker's modules once, then forks one child per
worker on request. The child becomes a worker exactly as a spawned one would: a session of its own,
the worker's working directory, its allow-listed environment in place of the zygote's, its output
into the parent's log pipe, every other inherited descriptor closed, then `worker.serve` on its
channel. Nothing of a candidate ever runs in the zygote, so no worker sees another's state; what a
child inherits is the zygote's import of torch, which no command has used.

The zygote never creates a CUDA context (a fork after one is unusable), so GPU lanes keep spawning
fresh interpreters. The zygote runs no Python thread of its own (it polls its channel rather than run
a watcher thread), so a fork never copies a lock one of them held; the native threads torch's import
starts (OpenBLAS's pool) are idle, and OpenBLAS makes itself safe to fork.

The zygote is `python -m cutegen.evaluate.worker --zygote FD`. Protocol: one SOCK_SEQPACKET socket
pair, one JSON message per packet. The parent sends
{"id", "cwd", "env", "warm_profiler", "warm_compile", "nice"} with two descriptors (the worker's
channel and the write end of its log pipe); the zygote answers {"id", "pid"}, and reports
{"exit": pid, "returncode": code} (negative: killed by that signal, as subprocess.Popen says) for
each child it reaps. A zygote whose parent is gone kills its children's sessions and exits.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from cutegen.errors import ToolchainError

MAX_PACKET_BYTES = 1 << 20  # an environment and a path: far below this


# What a worker reads only when its interpreter starts (sys.path from PYTHONPATH, the hash seed...)
# must be its own: a zygote serves requests whose environment equals its own but for these, which the
# worker reads later (TMPDIR at its first temporary file, the rest when it first touches the GPU).
PER_WORKER_ENV = ("TMPDIR", "CUDA_VISIBLE_DEVICES", "TEARDOWN_CUPTI")


class ForkedProcess:
    """What the parent holds of a forked worker: the `subprocess.Popen` surface worker.py uses (pid,
    stdout, poll, wait, returncode), its exit status reported by the zygote that reaped it."""

    def __init__(self, server: "_Server", pid: int, stdout: Any) -> None:
        self.server, self.pid, self.stdout = server, pid, stdout
        self.args = f"forked worker {pid}"

    @property
    def returncode(self) -> int | None:
        return self.server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


class Zygote:
    """The parent's fork servers: one for each start-up environment asked for (most runs need one),
    each started at its first `spawn`; `close` ends them and every worker they forked."""

    def __init__(self, start_timeout_s: float = 300.0) -> None:
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._servers: dict[tuple, _Server] = {}

    def spawn(self, cwd: Path, env: dict[str, str], channel: int, *, warm_profiler: bool, warm_compile: bool,
              nice: int) -> ForkedProcess:
        """Fork a worker serving `channel` (still the caller's to close) in `cwd` with `env`; its output
        goes into a new pipe, the returned process's `stdout`."""
        key = tuple(sorted((k, v) for k, v in env.items() if k not in PER_WORKER_ENV))
        with self._lock:
            server = self._servers.get(key)
            if server is None or server.ended:
                server = self._servers[key] = _Server(env, self.start_timeout_s)
        log_r, log_w = os.pipe()
        try:
            pid = server.spawn({"cwd": str(cwd), "env": env, "warm_profiler": warm_profiler,
                                "warm_compile": warm_compile, "nice": nice}, [channel, log_w])
        except BaseException:
            os.close(log_r)
            raise
        finally:
            os.close(log_w)
        return ForkedProcess(server, pid, open(log_r, "rb"))  # noqa: SIM115 - the worker's log stream

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:  # all told at once: each then ends its children and exits in parallel
            server.shut()
        for server in servers:
            server.close()


class _Server:
    """One zygote process (started at once, with a worker's environment and a folder of its own as
    TMPDIR) and the thread that reads its replies and exit reports."""

    def __init__(self, env: dict[str, str], start_timeout_s: float) -> None:
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()  # one spawn request at a time
        self._cond = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: dict[int, int] = {}
        self._ids = itertools.count(1)
        self.ended = False
        self._workdir = Path(tempfile.mkdtemp(prefix="cutegen-zygote-"))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = self._workdir / "zygote.log"  # why it could not start, quoted by `spawn`
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "cutegen.evaluate.worker", "--zygote", str(theirs.fileno())],
                cwd=self._workdir, env={**env, "TMPDIR": str(self._workdir)}, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self._sock = ours
        threading.Thread(target=self._read, name="cutegen-zygote-reader", daemon=True).start()

    def _read(self) -> None:
        """Replies to spawn requests and exit reports, until the zygote's channel closes."""
        while True:
            try:
                packet = self._sock.recv(MAX_PACKET_BYTES)
            except OSError:
                packet = b""
            with self._cond:
                if not packet:
                    self.ended = True
                    self._cond.notify_all()
                    return
                message = json.loads(packet)
                if "exit" in message:
                    self._exits[int(message["exit"])] = int(message["returncode"])
                else:
                    pid = int(message.get("pid", -1))
                    self._exits.pop(pid, None)  # an earlier process of the same pid: its report is stale
                    self._replies[int(message["id"])] = pid
                self._cond.notify_all()

    def spawn(self, request: dict[str, Any], fds: list[int]) -> int:
        with self._lock:
            request_id = next(self._ids)
            try:
                socket.send_fds(self._sock, [json.dumps({"id": request_id, **request}).encode()], fds)
            except OSError as err:
                raise self._failed(f"its channel is closed ({err})") from None
            deadline = time.monotonic() + self.start_timeout_s  # its first answer waits for its import of torch
            with self._cond:
                while request_id not in self._replies:
                    left = deadline - time.monotonic()
                    if self.ended or left <= 0:
                        raise self._failed("it ended" if self.ended else f"no answer in {self.start_timeout_s:g} s")
                    self._cond.wait(left)
                pid = self._replies.pop(request_id)
        if pid < 0:
            raise self._failed("it could not fork")
        return pid

    def _failed(self, what: str) -> ToolchainError:
        try:
            tail = self._log.read_text(encoding="utf-8", errors="replace")[-2000:].strip()
        except OSError:
            tail = ""
        return ToolchainError(f"The fork server of the evaluation workers failed: {what}."
                              + (f" Its log ends:\n{tail}" if tail else ""),
                              "Check that torch imports in this Python (`python -c 'import torch'`); or pass"
                              " fork_server=False to the Evaluator to start each worker on its own.")

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            # The zygote ended: its children ended with it (each watches its parent).
            return -signal.SIGKILL if self.ended else None

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits and not self.ended:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
        return self.exit_code(pid)

    def shut(self) -> None:
        """Tell the zygote to end: it reads the end of its channel, kills its children and exits."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shut()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10.0)
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        with contextlib.suppress(OSError):
            self._sock.close()
        shutil.rmtree(self._workdir, ignore_errors=True)


# ------------------------------------------------------------------------------- the zygote's side


def _become_worker(request: dict[str, Any], channel: int, log: int, serve: Callable[..., None]) -> None:
    """In the forked child: take the worker's place (session, files, directory, environment), then
    serve. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        keep = os.dup(channel) if channel < 3 else channel
        # Only the channel and stdio stay open: not the zygote's own channel, nor another child's.
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
        own = os.getcwd()  # the zygote's folder: `python -m` put it first on sys.path, as a spawn puts its own
        os.chdir(request["cwd"])
        sys.path[:] = [request["cwd"] if entry in ("", own) else entry for entry in sys.path]
        started_in = sys.modules.get("multiprocessing.process")
        if started_in is not None:
            started_in.ORIGINAL_DIR = request["cwd"]  # type: ignore[attr-defined]
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR is the worker's own directory, read again at the next use
        for handled in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(handled, signal.SIG_DFL)
        if request.get("nice"):
            os.nice(int(request["nice"]))
        serve(keep, warm_profiler=bool(request.get("warm_profiler")), warm_compile=bool(request.get("warm_compile")))
        code = 0
    except BaseException:  # noqa: BLE001 - whatever ended the worker, its status says so
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _report(sock: socket.socket, children: set[int], message: dict[str, Any]) -> None:
    """Send one message to the parent; a parent that is gone ends the zygote and its children."""
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        _end_children(children)
        os._exit(1)


def _end_children(children: set[int]) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def serve_zygote(fd: int, serve: Callable[..., None], poll_s: float = 0.5) -> None:
    """The zygote's loop (`python -m cutegen.evaluate.worker --zygote FD`, which passes its `serve`):
    import what every worker imports, then fork on request, each child running `serve`, and report
    exits."""
    import torch  # noqa: F401 - lazy: the import each forked worker then has without paying for it

    # lazy: likewise the worker's command modules, which the parent's side never loads
    from cutegen.evaluate import protocol  # noqa: F401

    sock = socket.socket(fileno=fd)
    parent = os.getppid()
    children: set[int] = set()
    # A child's end wakes the loop at once (its parent's kill waits for the exit report).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [], poll_s)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _report(sock, children, {"exit": pid, "returncode": os.waitstatus_to_exitcode(status)})
        if os.getppid() != parent:
            _end_children(children)
            os._exit(1)
        if sock not in ready:
            continue
        try:
            packet, fds, _, _ = socket.recv_fds(sock, MAX_PACKET_BYTES, 2)
        except OSError:
            packet, fds = b"", []
        if not packet:
            _end_children(children)
            return
        request = json.loads(packet)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork() if len(fds) == 2 else -1
        except OSError:  # no memory or process slot left: the parent hears it as a failed fork
            pid = -1
        if pid == 0:
            _become_worker(request, fds[0], fds[1], serve)
        for descriptor in fds:
            os.close(descriptor)
        if pid > 0:
            children.add(pid)
        _report(sock, children, {"id": request["id"], "pid": pid})
