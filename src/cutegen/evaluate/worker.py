"""Isolation: each candidate is built and run in a worker process of its own.

The protocol (EVALUATION.md, "Isolation"):

- A worker is a fresh Python process (`python -m cutegen.evaluate.worker FD`; a CPU-only worker is
  forked instead from a zygote that imported torch once, zygote.py) pinned to one GPU
  through `CUDA_VISIBLE_DEVICES`, started in a fresh temporary working directory (also its TMPDIR),
  with an allow-listed environment, in a process group of its own (`start_new_session`), with its
  stdout and stderr merged into a pipe of which the parent keeps only the last `log_tail_bytes`.
- A worker serves exactly one candidate's job. Nothing a candidate does to the interpreter, to torch
  or to the CUDA context can reach the next candidate: the next job gets a new process. A task's
  reference process (reference.py) serves many candidates but never runs one; only a reference
  process whose job was a suite's baselines takes another task's job, after releasing the last one
  (`baselines.BaselineWorker`); protocol.py keeps the roles apart. Start-up is paid in advance and
  in two parts: a pool's spares import torch as soon as they are started (CPU work only; a GPU
  lane's pool keeps several, as an evaluation is shorter than a start), and create their CUDA
  context and load the profiler (`begin_warm`) only when nothing is being measured: a GPU lane's
  evaluation asks once the parent's clock is calibrated and again after timing (pipeline.py; a pool
  can also warm them when a job takes its worker, `warm_on_take`). The job waits for
  the spares' CUDA contexts before it churns free memory (`Worker.quiet`: a context created while
  a churn holds all free memory would fail) and for everything they do before anything is timed
  (`Worker.settle`), so start-up work never overlaps a measurement. A pool can pin its workers to
  a set of CPU cores, away from the compilers of a build pool.
- Parent and worker talk over a private socket pair inherited as a file descriptor, in
  length-prefixed JSON (never pickle: the parent must not execute anything the worker sends, and
  never stdout: what the candidate prints cannot pose as a result). Each command carries a fresh
  nonce that its reply must echo: a reply written to the channel by the candidate, or one out of
  order, ends the job with `worker_protocol`. The parent sends one command at a time and waits for
  the reply with that command's timeout (build commands get the build timeout, everything else the
  run timeout).
- A timeout kills the whole process group with SIGKILL, and every descendant that started a group
  of its own (nvcc does), found through /proc; a worker that dies (a segfault, an abort, the OOM
  killer) or closes the channel ends the job with `WorkerDied`, whose `reason` names what happened.
  A worker whose CUDA context is broken after a command (a sticky error, probed with a synchronize
  and a tiny kernel) reports it, and is never used again, like every other worker.
- The worker only measures; the parent decides pass or fail from the returned measurements.

This is a robust harness against buggy and reward-hacking code, not a security sandbox: code in the
worker runs with the user's rights, can read the files the user can read, can find the channel's
file descriptor, and a process it double-forks into a new session (whose parent is then no longer
the worker) escapes the kill. Run untrusted code from unknown sources in a container or VM as well.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterator

from cutegen.errors import ToolchainError
from cutegen.evaluate.zygote import ForkedProcess, Zygote, serve_zygote

MAX_MESSAGE_BYTES = 64 << 20  # a reply larger than this is not from our code: treat as corrupted
START_TIMEOUT_S = 300.0  # importing torch and creating a CUDA context on a busy machine

# Passed through to the worker as they are; everything else in the parent's environment is dropped.
# (The worker needs a working toolchain and Python; it does not need the user's API keys.)
_ENV_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "SHELL", "LD_LIBRARY_PATH",
              "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX", "OMP_NUM_THREADS",
              "MKL_NUM_THREADS", "XDG_CACHE_HOME")
_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_")


class WorkerDied(Exception):
    """The worker ended (or was ended) before replying: `reason` is a check name for the Verdict."""

    def __init__(self, reason: str, detail: str, log_tail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # "run_timeout", "build_timeout", "worker_crashed", "worker_protocol"
        self.detail = detail
        self.log_tail = log_tail


def worker_environment(source: dict[str, str], device: str, gpu: int | None, workdir: Path,
                       profiler: bool = True) -> dict:
    """The allow-listed environment of a worker (the caller passes `os.environ` in); `profiler`: the
    worker opens a profiler session (see TEARDOWN_CUPTI below)."""
    env = {k: v for k, v in source.items() if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)}
    env["CUDA_VISIBLE_DEVICES"] = str(gpu) if device == "cuda" and gpu is not None else ""
    if device != "cuda":
        # A CPU worker computes on one thread unless told otherwise: OpenMP's threads spin after each
        # parallel op and took the cores from the timing loop around the calls (on 2 cores, 3x its
        # calibrated cost), which the parent's clock then saw as time the reported times lacked.
        env.setdefault("OMP_NUM_THREADS", "1")
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding `cutegen/`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["TMPDIR"] = str(workdir)
    # Kineto detaches CUPTI when a profiler session ends. Left attached (PyTorch's default), it slowed
    # every later call of a 6 us kernel by 1-2.5 us on an H200; detached, the calls timed as in a
    # process that never profiled, and a later session still started in 0.01 s (the first takes
    # 3.5 s), so warming the profiler in the spare keeps its point. But set, it also slowed every
    # call made *before* the first session (a 6 us kernel timed 31 us, a 132 us one 140 us), so a
    # worker that never profiles (a reference process timing the baselines) goes without it.
    if profiler:
        env["TEARDOWN_CUPTI"] = "1"
    else:
        env.pop("TEARDOWN_CUPTI", None)
    env["PYTHONUNBUFFERED"] = "1"  # the log tail then holds what was printed right before a crash
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class _Tail(threading.Thread):
    """Drains the worker's stdout+stderr, keeping only the last `limit` bytes (memory stays bounded
    and a worker that prints without end never blocks on a full pipe)."""

    def __init__(self, stream: Any, limit: int) -> None:
        super().__init__(daemon=True)
        self._stream, self._limit, self._buf = stream, limit, bytearray()
        self._lock = threading.Lock()

    def run(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := self._stream.read1(1 << 16):
                with self._lock:
                    self._buf += chunk
                    if len(self._buf) > 2 * self._limit:
                        del self._buf[: -self._limit]

    def text(self) -> str:
        with self._lock:
            return bytes(self._buf[-self._limit:]).decode("utf-8", errors="replace")


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children, grandchildren...), read from /proc; empty where
    there is no /proc (there, only the worker's own process group is killed)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


class Worker:
    """One worker process and its private channel; serves one job (or a series of baseline jobs),
    then is closed."""

    def __init__(self, device: str, gpu: int | None, log_tail_bytes: int, warm_profiler: bool = True,
                 warm_compile: bool = False, cpus: tuple[int, ...] | None = None, nice: int = 0,
                 zygote: Zygote | None = None) -> None:
        self.device, self.gpu = device, gpu
        self.workdir = Path(tempfile.mkdtemp(prefix="cutegen-eval-"))
        parent_sock, child_sock = socket.socketpair()
        env = worker_environment(dict(os.environ), device, gpu, self.workdir, profiler=warm_profiler)
        self.process: subprocess.Popen | ForkedProcess
        if zygote is not None and device == "cpu":  # forked from an image that imported torch (zygote.py)
            try:
                self.process = zygote.spawn(self.workdir, env, child_sock.fileno(), warm_profiler=warm_profiler,
                                            warm_compile=warm_compile, nice=nice)
            except BaseException:
                parent_sock.close()
                child_sock.close()
                shutil.rmtree(self.workdir, ignore_errors=True)
                raise
        else:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cutegen.evaluate.worker", str(child_sock.fileno()),
                 *([] if warm_profiler else ["--no-profiler"]), *(["--warm-compile"] if warm_compile else []),
                 *([f"--nice={nice}"] if nice else [])],
                cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, pass_fds=(child_sock.fileno(),), start_new_session=True,
            )
        child_sock.close()
        if cpus:  # the GPU lane's workers keep their cores free of the build pool's compilers
            with contextlib.suppress(OSError, AttributeError):
                os.sched_setaffinity(self.process.pid, cpus)
        self.conn = Connection(parent_sock.detach())
        self._tail = _Tail(self.process.stdout, log_tail_bytes)
        self._tail.start()
        self.started: dict[str, Any] = {}  # the start-up report: torch imported, nothing on the GPU yet
        self.info: dict[str, Any] = {}  # after the warm-up: the device's description
        self._warm_sent = False
        self._context_made = False  # the warm-up's first reply came: the CUDA context exists
        self.closed = False
        # set by the pool (see WorkerPool.worker): waits, and says the seconds of each wait
        self.settle: Callable[[], dict[str, float]] = lambda: {}
        self.quiet: Callable[[], None] = lambda: None  # likewise

    def pin(self, cpus: tuple[int, ...] | None) -> None:
        """Move every thread of the worker to `cpus` (a spare starts elsewhere, on the build pool's
        cores, and moves to its lane's cores when it is taken)."""
        if not cpus or self.closed:
            return
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{self.process.pid}/task")]
        except OSError:
            threads = [self.process.pid]
        for tid in threads:
            with contextlib.suppress(OSError, AttributeError):
                os.sched_setaffinity(tid, cpus)

    def wait_started(self, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        """Block until the worker has imported torch (CPU work only: it has not touched the GPU)."""
        if not self.started:
            reply = self._receive(timeout_s, "worker_start_timeout", "start")
            if not reply.get("ready"):
                self.kill()
                raise ToolchainError(
                    f"An evaluation worker could not start: {reply.get('error', reply)}",
                    "Check that torch imports in this Python and, for --device cuda, that"
                    " `python -c 'import torch; torch.zeros(1, device=\"cuda\")'` works.",
                )
            self.started = reply
        return self.started

    def has_started(self) -> bool:
        """Whether the worker has imported torch, without waiting (False also for one that failed
        to start: `wait_started` reports that)."""
        if self.started or self.closed:
            return bool(self.started)
        try:
            if not self.conn.poll(0):
                return False
            self.wait_started()
        except (ToolchainError, WorkerDied):
            return False
        return True

    def begin_warm(self) -> None:
        """Let the worker create its CUDA context (and load the profiler) as soon as it has imported
        torch, without waiting for either: the pool asks for it only when no measurement is running
        on the GPU, and the command waits in the channel until the worker reads it after its start.
        (Waiting here for the import held the GPU's lane for seconds while compilers filled the
        cores.) A worker that failed to start is reported by `wait_started`, not here."""
        if self._warm_sent or self.closed:
            return
        with contextlib.suppress(OSError):
            self.conn.send_bytes(b'{"command": "warm"}')
            self._warm_sent = True

    def wait_context(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until a warm-up that was asked for has created its CUDA context (the first of the
        warm-up's two replies; the profiler loads after it). Nothing to wait for without a warm-up."""
        if self._context_made or self.info or not self._warm_sent or self.closed:
            return
        self.wait_started(timeout_s)
        self._warm_reply(self._receive(timeout_s, "worker_start_timeout", "warm-up"))
        self._context_made = True

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        """Block until the worker is warm: torch imported, CUDA context created, profiler loaded."""
        if not self.info:
            self.begin_warm()
            self.wait_started(timeout_s)
            if not self._warm_sent:
                raise self._died("worker_crashed", "the channel broke before its warm-up")
            self.wait_context(timeout_s)
            reply = self._warm_reply(self._receive(timeout_s, "worker_start_timeout", "warm-up"))
            self.info = {**self.started, **reply["data"]}
        return self.info

    def _warm_reply(self, reply: dict[str, Any]) -> dict[str, Any]:
        if not reply.get("ok"):
            self.kill()
            error = reply.get("error") or {}
            raise ToolchainError(
                f"An evaluation worker could not start: {error.get('type', '')}: {error.get('message', reply)}",
                "Check that torch imports in this Python and, for --device cuda, that"
                " `python -c 'import torch; torch.zeros(1, device=\"cuda\")'` works.",
            )
        return reply

    def call(self, command: str, payload: Any = None, *, timeout_s: float,
             timeout_reason: str = "run_timeout") -> dict[str, Any]:
        """Send one command; return the worker's reply ({"ok": bool, "data" | "error": ...})."""
        self.wait_ready()
        # The reply must echo this: one the candidate's Python code writes to the channel cannot, as the
        # audit hook keeps it out of the worker's frames and heap (guard.py).
        nonce = secrets.token_hex(8)
        try:
            self.conn.send_bytes(json.dumps({"command": command, "payload": payload, "nonce": nonce}).encode())
        except OSError as err:
            raise self._died("worker_crashed", f"the channel broke before {command}: {err}") from None
        reply = self._receive(timeout_s, timeout_reason, command)
        if reply.get("nonce") != nonce:
            raise self._died("worker_protocol", f"the reply to {command} does not answer it (written by the"
                             " candidate, or out of order)")
        return reply

    def _receive(self, timeout_s: float, timeout_reason: str, what: str) -> dict[str, Any]:
        try:
            ready = self.conn.poll(timeout_s)
        except OSError:
            ready = True  # a broken channel: recv below tells what happened
        if not ready:
            self._dump_stack()
            raise self._died(timeout_reason, f"{what} did not finish within {timeout_s:g} s")
        try:
            raw = self.conn.recv_bytes(MAX_MESSAGE_BYTES)
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5.0)
            status = _describe_exit(self.process.returncode)
            raise self._died("worker_crashed", f"the worker {status} during {what}") from None
        try:
            reply = json.loads(raw)
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except ValueError as err:
            raise self._died("worker_protocol", f"the reply to {what} was not ours ({err})") from None
        return reply

    def _dump_stack(self) -> None:
        """Ask a stuck worker for its Python stack (faulthandler on SIGUSR1), for the log tail: it
        shows where the candidate was when it hung."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.process.pid, signal.SIGUSR1)
            time.sleep(0.5)

    def _died(self, reason: str, detail: str) -> WorkerDied:
        self.kill()
        return WorkerDied(reason, detail, self.log_tail())

    def log_tail(self) -> str:
        """The last bytes the worker printed (complete once the worker is closed)."""
        return self._tail.text()

    def kill(self) -> None:
        """SIGKILL the worker's process group and every process it started in a group of its own
        (nvcc runs in its own session), reap it and remove its working directory."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGSTOP)  # freeze the group: it starts nothing new
        for pid in descendants(self.process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group not in (self.process.pid, os.getpgrp()):
                    os.killpg(group, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # a forked worker not yet in its own group
            os.kill(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30.0)
        self._tail.join(timeout=2.0)  # the pipe closes with the group: collect the last output
        self.conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self) -> None:
        """End a worker that finished its job: killed at once (`kill`). Asking it to exit would run the
        interpreter's shutdown first, a candidate's atexit handlers and finalizers among it, and the
        lane waits for a closing worker before it times anything (`WorkerPool._settle`)."""
        self.kill()


class WorkerPool:
    """Hands out fresh, warmed workers: one at a time per slot (a GPU index, or a CPU slot).

    `worker()` blocks until a slot is free, takes that slot's oldest spare (starting a new one at
    once: a slot keeps `spares` of them) and closes the worker when the block ends, whatever
    happened in it. With `warm_on_take`, taking a worker lets the spares that have imported torch
    warm up (the job then calls `quiet` before it churns memory and `settle` before it times).
    `warm_profiler=False` makes workers that start 3.5 s sooner on an H200, without TEARDOWN_CUPTI
    (see `worker_environment`): for a pool that never profiles (baselines, builds; no kernel audit).
    `warm_compile=True` makes workers import torch.compile's machinery while they wait (about 3 s
    of a first compile, measured on the CPU machine): for a pool that measures compiled baselines.
    """

    def __init__(self, device: str = "cuda", gpus: tuple[int, ...] = (0,), *, cpu_slots: int = 1,
                 log_tail_bytes: int = 16384, warm_spares: bool = True, warm_profiler: bool = True,
                 warm_compile: bool = False, cpus: tuple[int, ...] | None = None,
                 spare_cpus: tuple[int, ...] | None = None, nice: int = 0, spares: int = 1,
                 warm_on_take: bool = False, zygote: Zygote | None = None) -> None:
        self.device, self.nice, self.zygote = device, nice, zygote
        self.spares_per_slot, self.warm_on_take = max(1, spares), warm_on_take
        self.warm_profiler, self.warm_compile = warm_profiler, warm_compile
        # A taken worker runs on `cpus`; a spare starts on `spare_cpus` (the build pool's, where
        # importing torch cannot slow a measurement on `cpus`) and moves to `cpus` when taken.
        self.cpus, self.spare_cpus = cpus, spare_cpus
        self._closing: list[threading.Thread] = []  # workers being closed in the background
        self.slots: list[int | None] = list(gpus) if device == "cuda" else [None] * cpu_slots
        self.log_tail_bytes = log_tail_bytes
        self.warm_spares = warm_spares
        self.device_info: dict[str, Any] | None = None  # the last ready worker's report
        self._free = list(range(len(self.slots)))
        self._spares: dict[int, list[Worker]] = {}  # slot -> its spares, oldest (taken next) first
        self._cond = threading.Condition()

    @classmethod
    def for_config(cls, config: Any, **kwargs: Any) -> "WorkerPool":
        return cls(config.device, tuple(config.gpus), log_tail_bytes=config.log_tail_bytes, **kwargs)

    def _spawn(self, slot: int) -> Worker:
        return Worker(self.device, self.slots[slot], self.log_tail_bytes, self.warm_profiler, self.warm_compile,
                      self.spare_cpus or self.cpus, self.nice, self.zygote)

    def _spares_apart(self) -> bool:
        """Whether a starting spare runs on other cores than the taken worker."""
        return bool(self.cpus and self.spare_cpus and not set(self.cpus) & set(self.spare_cpus))

    def close_later(self, worker: Worker) -> None:
        """Close a worker in the background: a process that held gigabytes of device memory takes
        seconds to end, which the next job's first steps overlap; `_settle` waits for it before
        anything is timed."""
        if self.device != "cuda":  # a CPU worker ends at once
            worker.close()
            return
        thread = threading.Thread(target=worker.close, name="cutegen-worker-close", daemon=True)
        thread.start()
        with self._cond:
            self._closing = [t for t in self._closing if t.is_alive()] + [thread]

    def closing(self) -> int:
        """How many workers are still ending in the background."""
        with self._cond:
            return sum(t.is_alive() for t in self._closing)

    def wait_closed(self) -> None:
        with self._cond:
            closing, self._closing = list(self._closing), []
        for thread in closing:
            thread.join()

    @contextlib.contextmanager
    def worker(self) -> Iterator[Worker]:
        with self._cond:
            while not self._free:
                self._cond.wait()
            slot = self._free.pop(0)
            waiting = self._spares.get(slot) or []
            spare = waiting.pop(0) if waiting else None
        try:
            worker = self._ready(spare, slot)
            worker.pin(self.cpus)
            if self.warm_spares:
                with self._cond:
                    waiting = self._spares.setdefault(slot, [])
                    waiting += [self._spawn(slot) for _ in range(self.spares_per_slot - len(waiting))]
                worker.settle = lambda: self._settle(slot)
                worker.quiet = lambda: self._quiet(slot)
                if self.warm_on_take:
                    self.warm_spare(slot)
            self.device_info = worker.info
            try:
                yield worker
            finally:
                self.close_later(worker)
        finally:
            self.warm_spare(slot, younger=False)
            with self._cond:
                self._free.append(slot)
                self._cond.notify()

    def warm_spare(self, slot: int | None = None, younger: bool = True) -> None:
        """Let the spares of `slot` (every slot's, when None) warm up now: create their CUDA contexts
        and load the profiler. A spare only imports torch when it is started; its GPU work waits for
        this, which the evaluation asks for when nothing it measures is running. The oldest spare is
        always asked (it is the next job's: its warm-up waits in the channel until its import is
        done); with `younger`, the others too once they have imported torch, so that `quiet` never
        waits for an import. At a job's end only the oldest is asked: a younger spare's warm-up begun
        then is still running when the next job calibrates its clock, which must wait for it (up to
        11 s an evaluation on the H200 while compilers filled the cores, bench/results part K); the
        next job asks for the younger ones once its calibration is done."""
        with self._cond:
            slots = [(k, list(w)) for k, w in self._spares.items() if slot is None or k == slot]
        for _, spares in slots:
            for index, spare in enumerate(spares):
                if index == 0 or (younger and spare.has_started()):
                    with contextlib.suppress(ToolchainError, WorkerDied):
                        spare.begin_warm()

    def info(self) -> dict[str, Any]:
        """The device's description (name, torch version...) from a ready worker; learning it starts
        a slot's spare and waits for it without using it up, so cache lookups cost no worker."""
        if self.device_info is None:
            with self._cond:
                slot = self._free[0] if self._free else 0
                waiting = self._spares.setdefault(slot, [])
                if not waiting:
                    waiting.append(self._spawn(slot))
                spare = waiting[0]
            self.device_info = spare.wait_ready()
        return self.device_info

    def _settle(self, slot: int) -> dict[str, float]:
        """Wait until no start-up work shares the GPU, or the timed worker's CPUs, with a measurement:
        ending workers gone, the slot's spares' CUDA contexts made where their warm-up was asked for,
        and their torch imports done where they start on the same cores. Returns the seconds waited
        for ending workers ("closing") and for the spares ("spares").

        A spare's profiler load may go on (`_warm_profiler`: 3.5 s of CPU on the spares' cores, one
        4-byte kernel): waiting for it took 3.2 s of an evaluation's 8 on the H200 (part M of
        bench/results). Its one kernel can cost one timed call a context switch, which only makes
        that call slower, and a batch's median does not move for one call."""
        started = time.perf_counter()
        self.wait_closed()
        closed = time.perf_counter()

        def settled(spare: Worker) -> None:
            if not self._spares_apart():
                spare.wait_started()
            spare.wait_context()

        self._each_spare(slot, settled)
        return {"closing": closed - started, "spares": time.perf_counter() - closed}

    def _quiet(self, slot: int) -> None:
        """Wait until no spare of the slot is creating its CUDA context: a job's churn takes all free
        device memory for a moment, and a context created then would fail for want of it."""
        self._each_spare(slot, lambda spare: spare.wait_context())

    def _each_spare(self, slot: int, wait: Callable[[Worker], Any]) -> None:
        with self._cond:
            spares = list(self._spares.get(slot) or [])
        for spare in spares:
            try:
                wait(spare)
            except (ToolchainError, WorkerDied):  # a failed spare is replaced at the next acquire
                with self._cond:
                    if spare in self._spares.get(slot, []):
                        self._spares[slot].remove(spare)

    def _ready(self, spare: Worker | None, slot: int) -> Worker:
        """A ready worker: the spare, or a new one when the spare failed to start (a spare that
        created its CUDA context while another job churned the GPU's memory may fail; one retry)."""
        for attempt in range(2):
            worker = spare if spare is not None and attempt == 0 else self._spawn(slot)
            try:
                worker.wait_ready()
                return worker
            except (ToolchainError, WorkerDied):
                worker.kill()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._cond:
            spares, self._spares = [w for waiting in self._spares.values() for w in waiting], {}
        for worker in spares:
            worker.kill()
        self.wait_closed()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ------------------------------------------------------------------------------- the worker's side


def _send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message, default=str).encode())


def _startup_info(warm_compile: bool) -> dict[str, Any]:
    """The start-up report: torch imported (and torch.compile's machinery, when asked), nothing on
    the GPU yet (see `_warm`)."""

    import torch  # lazy: loading torch takes seconds

    info: dict[str, Any] = {"ready": True, "pid": os.getpid(), "python": platform.python_version(),
                            "torch_version": torch.__version__}
    info["compile_warmed"] = warm_compile and _warm_compile()
    return info


def _uses_cuda() -> bool:
    import torch  # lazy: loading torch takes seconds

    return bool(os.environ.get("CUDA_VISIBLE_DEVICES")) and torch.cuda.is_available()


def _create_context() -> None:
    """The warm-up's first part: the CUDA context, and one small block in the caching allocator (the
    profiler's warm-up then allocates nothing new)."""
    import torch  # lazy: loading torch takes seconds

    if _uses_cuda():
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()


def _warm(warm_profiler: bool) -> dict[str, Any]:
    """The warm-up's second part, after `_create_context`: load the profiler and describe the device,
    off the critical path of the job."""

    import torch  # lazy: loading torch takes seconds

    info: dict[str, Any] = {"cuda": torch.cuda.is_available()}
    if _uses_cuda():
        if warm_profiler:
            _warm_profiler()
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    l2_bytes=int(getattr(props, "L2_cache_size", 0)), total_memory=props.total_memory,
                    cuda_runtime=torch.version.cuda)
    else:
        info.update(device_name=f"cpu ({platform.processor() or platform.machine()})")
    return info


def _warm_compile() -> bool:
    """Import what torch.compile's first call would import (dynamo, inductor's compiler)."""
    try:
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    except Exception:  # noqa: BLE001 - a failed import only leaves the first compile slower
        return False
    return True


def _warm_profiler() -> None:
    """The first profiler session of a process loads CUPTI (about 3.5 s on an H200); the kernel audit
    needs one, so a spare pays it while it waits. With TEARDOWN_CUPTI=1 (see `worker_environment`)
    CUPTI is detached again when it ends, so the calls timed later do not pay for it."""
    import torch  # lazy: loading torch takes seconds

    try:
        from torch.profiler import ProfilerActivity, profile  # lazy: loading torch takes seconds

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a missing CUPTI only makes the first kernel audit slower
        pass


def _watch_parent(interval_s: float = 1.0) -> None:
    """Ends the worker's process group when the parent is gone. A parent killed outright (SIGKILL, or
    a SIGTERM it does not handle) cannot stop its workers, which run in sessions of their own: an
    orphan still timing or profiling would share the GPU with whatever runs next."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="cutegen-parent-watch", daemon=True).start()


def serve(fd: int, warm_profiler: bool = True, warm_compile: bool = False) -> None:
    """The worker's loop: announce readiness, then run commands until the channel closes (the parent
    ends a worker by killing it: Worker.close)."""

    _watch_parent()
    faulthandler.enable()  # a segfault in a candidate's library prints the Python stack to the log tail
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent's request before a timeout kill
    conn = Connection(fd)
    started = time.perf_counter()
    try:
        info = _startup_info(warm_compile)
    except BaseException as err:  # noqa: BLE001 - report why we cannot start, whatever it is
        _send(conn, {"ready": False, "error": f"{type(err).__name__}: {err}"[:2000]})
        return
    # lazy: the parent imports this module for Worker; the command modules load in workers only
    from cutegen.evaluate import protocol

    info["start_s"] = time.perf_counter() - started
    _send(conn, info)
    state: dict[str, Any] = {}
    while True:
        try:
            message = json.loads(conn.recv_bytes())
        except EOFError:
            return
        command = message.get("command")
        if command == "warm":  # two replies: the CUDA context exists (Worker.wait_context), then warm
            warmed = time.perf_counter()
            for part in (_create_context, lambda: _warm(warm_profiler)):
                try:
                    data = part() or {}
                    reply = {"ok": True, "data": {**data, "warm_s": time.perf_counter() - warmed}}
                except BaseException as err:  # noqa: BLE001 - report why the device cannot be used
                    reply = {"ok": False, "error": {"type": type(err).__name__, "message": str(err)[:2000]}}
                _send(conn, reply)
                if not reply["ok"]:
                    break
            continue
        nonce = message.get("nonce")
        _send(conn, {**protocol.run_command(state, command, message.get("payload")), "nonce": nonce})


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":  # a fork server of CPU workers (zygote.py), each child running serve
        serve_zygote(int(sys.argv[2]), serve)
        sys.exit(0)
    for flag in sys.argv[2:]:
        if flag.startswith("--nice="):  # before any thread exists: every later thread and child inherits it
            os.nice(int(flag.removeprefix("--nice=")))
    serve(int(sys.argv[1]), warm_profiler="--no-profiler" not in sys.argv[2:],
          warm_compile="--warm-compile" in sys.argv[2:])
