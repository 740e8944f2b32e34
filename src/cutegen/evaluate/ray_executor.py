"""Evaluations on a Ray cluster: one actor per GPU, each running this machine's protocol on its node.

The protocol:

- The driver (the agent or `bench.evaluate_suite`, the only process that writes the journal or
  verdicts.jsonl) starts one `EvaluationNode` actor per free unit of the resource (`num_gpus=1`: Ray
  gives the actor one GPU and sets its CUDA_VISIBLE_DEVICES; a custom resource on a CPU cluster
  stands in for GPUs in the tests). Each actor owns an `Evaluator` (service.py) for its one GPU, kept
  for the run: its reference processes serve every later candidate of a task there, its spare
  worker stays warm, and its CPU build pool builds on the node's cores, beside the GPU's queue.
- An evaluation on an actor is `pipeline.evaluate_source`, the code path of a local one: a fresh,
  spawned worker process per candidate with an allow-listed environment in its own process group,
  killed on a timeout (worker.py); the same correctness, anti-cheat and timing protocols. The build
  cache (RuntimeConfig.cache_dir) and the probe and baseline caches (EvalConfig.cache_dir) are the
  node's own: the same paths, on each node's disk.
- By value: the driver sends the candidate's source text, and the Task and EvalConfig as JSON
  (records.to_json); the actor returns the Verdict as JSON, or the error it raised by class name
  (TaskError, ToolchainError, ConfigError; NeedsDevice), and the driver rebuilds it. No path of the
  driver's is read on a node. The agent's profile (Nsight Compute) runs on the task's actor too,
  holding its lane like an evaluation.
- Routing: an evaluation goes to the actor that already evaluated its task (its reference process
  is warm there) unless that actor has more evaluations in flight than another by more than one;
  an actor takes at most `actor_evaluations` at once.
- Faults: an evaluation whose actor dies (its process killed, its node lost: RayActorError) is sent
  again, to the restarted actor or another, at most `max_retries` times, each retry counted
  (`retries`; the agent journals it as `evaluate_retry`); past that the run stops with ClusterError.
  A lost attempt returned nothing, so the driver records the evaluation once. A driver killed
  mid-evaluation leaves an `evaluate` record without a step, which `cutegen resume` runs again (and
  only that one); Ray ends a dead driver's actors, and their workers end with them (a worker whose
  parent is gone kills its process group: worker._watch_parent).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cutegen.config import EvalConfig, ExecutorConfig, ProfileConfig
from cutegen.errors import ClusterError, ConfigError, CutegenError, TaskError, ToolchainError
from cutegen.evaluate.pipeline import NeedsDevice, evaluate_source, read_candidate
from cutegen.evaluate.service import Evaluator
from cutegen.profile.run import NcuProfiler, make_profiler
from cutegen.records import EvaluateRetry, Task, Verdict, from_json, to_json
from cutegen.tasks import source_sha256

_ERRORS = {cls.__name__: cls for cls in (TaskError, ConfigError, ToolchainError, ClusterError)}


def import_ray() -> Any:
    """The ray module, or a ConfigError that says how to install it."""
    try:
        import ray  # lazy: ray is optional (cutegen[ray])
    except ImportError:
        raise ConfigError("--executor ray needs the ray package, which is not installed here.",
                          'Install it with `pip install "cutegen[ray]"` (ray>=2.9) on the driver and on every node'
                          " of the cluster, or use --executor local.") from None
    return ray


# ------------------------------------------------------------------------------ the actor (on a node)


class EvaluationNode:
    """One unit of the cluster's resource (a GPU) with the evaluation service of its node (module
    docstring). Wrapped by `ray.remote` when the executor starts, so this module imports no ray."""

    def __init__(self, device: str, resource: str, build_jobs: int | None, log_tail_bytes: int) -> None:
        import ray  # lazy: ray is optional (cutegen[ray])

        self.gpu = _assigned_gpu(ray) if device == "cuda" else 0
        jobs = build_jobs if build_jobs is not None else _node_build_jobs(ray, resource)
        # Not pinned: service._split_cores sees the whole node, so every actor of a node would pin its
        # lane's workers to the same first cores.
        self.service = Evaluator(device, (self.gpu,), build_jobs=jobs, log_tail_bytes=log_tail_bytes, pin_cpus=False)
        self.node = ray.util.get_node_ip_address()
        self.running = 0
        self._lock = threading.Lock()

    def ready(self) -> dict[str, Any]:
        return {"where": self.where(), "build_jobs": self.service.build_jobs}

    def where(self) -> str:
        return f"{self.node} pid {os.getpid()} gpu {self.gpu}"

    def status(self) -> dict[str, Any]:
        """The actor's process and how many evaluations it is running now."""
        return {"pid": os.getpid(), "node": self.node, "evaluating": self.running}

    def evaluate(self, source: str, task_json: dict, config_json: dict, device_available: bool) -> dict[str, Any]:
        with self._lock:
            self.running += 1
        try:
            return {**_evaluate_here(self.service, self.gpu, source, task_json, config_json, device_available),
                    "where": self.where()}
        finally:
            with self._lock:
                self.running -= 1

    def profile(self, source: str, task_json: dict, config_json: dict, profile_json: dict) -> dict[str, Any]:
        """The agent's profiler on this actor's GPU, holding its lane; its text and its notices."""

        task, config = _decode(task_json, config_json, self.gpu)
        notes: list[str] = []
        profiler = make_profiler(from_json(ProfileConfig, profile_json), notify=notes.append)
        with tempfile.TemporaryDirectory(prefix="cutegen-profile-") as folder, self.service.lane(task):
            path = Path(folder) / "candidate.py"
            path.write_text(source, encoding="utf-8")
            return {"text": profiler(path, task, config), "notes": notes}

    def close(self) -> None:
        self.service.close()


def _decode(task_json: dict, config_json: dict, gpu: int) -> tuple[Task, EvalConfig]:
    """The task and the evaluation settings sent by the driver, the settings bound to this actor's GPU."""

    return from_json(Task, task_json), replace(from_json(EvalConfig, config_json), gpus=(gpu,))


def _evaluate_here(service: Any, gpu: int, source: str, task_json: dict, config_json: dict,
                   device_available: bool) -> dict[str, Any]:
    """One evaluation on this node; the verdict, or what stopped it, as JSON."""

    task, config = _decode(task_json, config_json, gpu)
    try:
        verdict = evaluate_source(source, task, config, service, device_available=device_available)
    except NeedsDevice as err:
        return {"needs_device": str(err)}
    except CutegenError as err:
        return {"error": type(err).__name__, "problem": err.problem, "fix": err.fix}
    return {"verdict": to_json(verdict)}


def _assigned_gpu(ray: Any) -> int:
    """The GPU Ray gave this actor, by its index on the node. Not 0: a worker is pinned with
    CUDA_VISIBLE_DEVICES set to its lane's index (worker.worker_environment), which replaces the
    actor's own, so the lane must hold the index Ray assigned."""
    ids = [str(i) for i in ray.get_gpu_ids()] or ["0"]  # none: a custom resource stands in for a GPU
    if not ids[0].isdigit():
        raise ClusterError(f"Ray assigned GPU {ids[0]!r}, not an index.",
                           "Let Ray assign GPUs by index (do not set CUDA_VISIBLE_DEVICES to UUIDs on the nodes).")
    return int(ids[0])


def _node_build_jobs(ray: Any, resource: str) -> int:
    """Builds at once on this actor's CPU pool: the node's cores shared among its units of the
    resource, one core left to each lane's workers."""
    node_id = ray.get_runtime_context().get_node_id()
    units = next((n["Resources"].get(resource, 0) for n in ray.nodes() if n["NodeID"] == node_id), 0)
    return max(1, int((os.cpu_count() or 2) // max(1, units)) - 1)


# ------------------------------------------------------------------------------ the driver's side


@dataclass
class _Actor:
    index: int
    handle: Any
    where: str = ""  # node, process and GPU, as it last said
    build_jobs: int = 1
    load: int = 0  # evaluations in flight
    tasks: set = field(default_factory=set)  # (task id, source hash) it evaluated: its warm references
    deaths: int = 0
    dead: bool = False  # restarted max_retries times already: Ray will not start it again


class RayExecutor:
    """The executor over a Ray cluster (module docstring); `executor.Executor`'s interface."""

    def __init__(self, executor: ExecutorConfig, config: EvalConfig, *, build_jobs: int | None = None) -> None:
        self.ray = import_ray()
        self.settings, self.config = executor, config
        self.resource = executor.resource or ("GPU" if config.device == "cuda" else "CPU")
        self._own_init = not self.ray.is_initialized()
        if self._own_init:
            self._connect()
        self.retries: list[EvaluateRetry] = []
        self._cond = threading.Condition()
        try:
            self.actors = self._start_actors(build_jobs)
        except BaseException:
            self.close()
            raise
        self.lanes = len(self.actors)
        self.build_jobs = sum(a.build_jobs for a in self.actors)
        self.slots = self.lanes * executor.actor_evaluations

    def _connect(self) -> None:
        address = self.settings.address
        try:
            self.ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ClusterError(f"Could not join the Ray cluster at {address or 'the default address'}: {err}",
                               "Start one (`ray start --head` on the head node, `ray start --address=HEAD:6379` on"
                               " each GPU node) and pass --executor ray:HEAD:6379.") from None

    def _free_units(self) -> int:
        """Actors that can start now: free units of the resource, as far as the free CPUs reach (an
        actor that cannot be placed would never answer). Waits for one (another run may be ending)."""
        deadline = time.monotonic() + self.settings.start_timeout_s
        cpus = self._actor_cpus()
        while True:
            total = self.ray.cluster_resources().get(self.resource, 0)
            available = self.ray.available_resources()
            free = int(available.get(self.resource, 0) + 1e-9)
            if cpus > 0:
                free = min(free, int(available.get("CPU", 0) / cpus + 1e-9))
            if free >= 1:
                return free
            if total < 1 or time.monotonic() > deadline:
                raise ClusterError(f"The Ray cluster has no free {self.resource} ({total:g} in all).",
                                   f"Add a node with one (`ray start --address=HEAD:6379` on a GPU machine), wait"
                                   " for other jobs to end, or pass --ray-resource with a resource the cluster has.")
            time.sleep(1.0)

    def _actor_cpus(self) -> float:
        """CPUs an actor reserves (at least the one unit when the resource is CPU itself)."""
        return max(1.0, self.settings.cpus_per_actor) if self.resource == "CPU" else self.settings.cpus_per_actor

    def _start_actors(self, build_jobs: int | None) -> list[_Actor]:
        free = self._free_units()
        count = min(free, self.settings.actors or free)
        options: dict[str, Any] = {"num_cpus": self._actor_cpus(), "max_restarts": self.settings.max_retries,
                                   # two more than it evaluates at once: status calls answer meanwhile
                                   "max_concurrency": self.settings.actor_evaluations + 2}
        if self.resource == "GPU":
            options["num_gpus"] = 1
        elif self.resource != "CPU":
            options["resources"] = {self.resource: 1}
        node = self.ray.remote(EvaluationNode).options(**options)
        args = (self.config.device, self.resource, build_jobs, self.config.log_tail_bytes)
        actors = [_Actor(i, node.remote(*args)) for i in range(count)]
        try:
            infos = self.ray.get([a.handle.ready.remote() for a in actors], timeout=self.settings.start_timeout_s)
        except (self.ray.exceptions.GetTimeoutError, self.ray.exceptions.RayActorError) as err:
            for actor in actors:
                self.ray.kill(actor.handle, no_restart=True)
            raise ClusterError(f"{count} evaluation actor(s) did not start within {self.settings.start_timeout_s:g} s:"
                               f" {_first_line(err)}", "Check that cutegen is installed on every node (`pip install"
                               " cutegen[ray]`) and that the nodes have the resources they announce.") from None
        for actor, info in zip(actors, infos):
            actor.where, actor.build_jobs = info["where"], info["build_jobs"]
        return actors

    # -- evaluations

    def evaluate(self, path: Path, task: Task, config: EvalConfig, *, device_available: bool = True,
                 on_retry: Any = None) -> Verdict:
        source = read_candidate(path)
        args = (source, to_json(task), to_json(config), device_available)
        for attempt in range(self.settings.max_retries + 1):
            actor, life = self._acquire(task)
            try:
                reply = self.ray.get(actor.handle.evaluate.remote(*args))
            except self.ray.exceptions.RayActorError as err:
                self._lost(actor, life)
                if attempt == self.settings.max_retries:
                    raise ClusterError(f"The evaluation of candidate {source_sha256(source)[:12]} for {task.task_id}"
                                       f" was lost with its actor {attempt + 1} times (last on {actor.where}):"
                                       f" {_first_line(err)}", "Check the cluster's nodes (`ray status`), then"
                                       " resume the run: it repeats only the unfinished evaluation.") from None
                retry = EvaluateRetry(task.task_id, source_sha256(source), attempt + 1, _first_line(err), actor.where)
                self._note_retry(retry, on_retry)
                continue
            finally:
                self._release(actor)
            actor.where = reply["where"]  # a restarted actor is another process
            return _rebuild(reply)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _note_retry(self, retry: EvaluateRetry, on_retry: Any) -> None:
        with self._cond:
            self.retries.append(retry)
        if on_retry is not None:
            on_retry(retry)

    def _acquire(self, task: Task) -> tuple[_Actor, int]:
        """The actor for the next evaluation of `task` (routing: module docstring), and its life."""
        key = (task.task_id, task.source_sha256)
        with self._cond:
            while True:
                alive = [a for a in self.actors if not a.dead]
                if not alive:
                    raise ClusterError("Every evaluation actor died more often than Ray restarts one.",
                                       "Check the cluster's nodes (`ray status`), then resume the run.")
                free = [a for a in alive if a.load < self.settings.actor_evaluations]
                if free:
                    break
                self._cond.wait()
            actor = min(free, key=lambda a: (a.load - (key in a.tasks), key not in a.tasks, a.index))
            actor.load += 1
            actor.tasks.add(key)
            return actor, actor.deaths

    def _release(self, actor: _Actor) -> None:
        with self._cond:
            actor.load -= 1
            self._cond.notify_all()

    def _lost(self, actor: _Actor, life: int) -> None:
        """The actor's process died in its life `life` (its deaths before it): Ray restarts it (up to
        max_retries times) without its references. The evaluations it ran then all fail; one death."""
        with self._cond:
            if actor.deaths != life:
                return
            actor.deaths += 1
            actor.tasks.clear()
            actor.dead = actor.deaths > self.settings.max_retries
            self._cond.notify_all()

    def status(self) -> list[dict[str, Any]]:
        """Each live actor's process and evaluations in flight (what a test kills, what an operator checks)."""
        live = [a for a in self.actors if not a.dead]
        return self.ray.get([a.handle.status.remote() for a in live])

    def device_available(self) -> bool:
        return True  # the actors hold the devices: each was started with one

    def profile(self, profiler: Any, path: Path, task: Task, config: EvalConfig) -> str | None:
        """Nsight Compute (profile.run.NcuProfiler, with its settings) on a GPU of the cluster, on the
        actor the task's evaluations go to; a caller's own profiler runs here, in the driver."""

        if not isinstance(profiler, NcuProfiler):
            return profiler(path, task, config)
        actor, life = self._acquire(task)
        try:
            reply = self.ray.get(actor.handle.profile.remote(read_candidate(path), to_json(task), to_json(config),
                                                             to_json(profiler.config)))
        except self.ray.exceptions.RayActorError as err:
            self._lost(actor, life)
            reply = {"text": None, "notes": [f"profile of {task.task_id} skipped (its actor died): {_first_line(err)}"]}
        finally:
            self._release(actor)
        for note in reply["notes"]:
            profiler.notify(note)
        return reply["text"]

    def close(self) -> None:
        """Close each actor's service (its workers and reference processes), then end the actors."""
        actors = getattr(self, "actors", [])
        with contextlib.suppress(Exception):
            self.ray.get([a.handle.close.remote() for a in actors if not a.dead], timeout=60)
        for actor in actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle, no_restart=True)
        self.actors = []
        if self._own_init:
            self.ray.shutdown()

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _rebuild(reply: dict[str, Any]) -> Verdict:
    """The actor's answer as the local pipeline gives it: a Verdict, or the exception it raised."""

    if "verdict" in reply:
        return from_json(Verdict, reply["verdict"])
    if "needs_device" in reply:
        raise NeedsDevice(reply["needs_device"])
    raise _ERRORS.get(reply["error"], CutegenError)(reply["problem"], reply["fix"])


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]
