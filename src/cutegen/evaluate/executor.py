"""Executors: where a driver's evaluations run. The agent and `bench.evaluate_suite` hand each whole
evaluation (`pipeline.evaluate_candidate`) to one and write its verdict themselves; an executor never
touches the journal or verdicts.jsonl.

- `LocalExecutor`: this machine's evaluation service (service.py): a CPU build pool and one lane
  per GPU of `EvalConfig.gpus`.
- `RayExecutor` (ray_executor.py): one actor per GPU of a Ray cluster, each with such a service
  of its own for its one GPU, on its node.

Both answer the same small interface (`Executor`); `make_executor` picks one from an ExecutorConfig.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from cutegen.config import EvalConfig, ExecutorConfig
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.ray_executor import RayExecutor
from cutegen.evaluate.service import Evaluator
from cutegen.records import EvaluateRetry, Task, Verdict

RetryNote = Callable[[EvaluateRetry], None]
Profiler = Callable[[Path, Task, EvalConfig], "str | None"]


class Executor(Protocol):
    """What the agent and evaluate_suite use.

    `evaluate` judges one candidate file for one task (raising what evaluate_candidate raises:
    TaskError, NeedsDevice...); `on_retry` hears of each time the evaluation had to be sent again.
    `slots`: evaluations worth keeping in flight at once (builds overlap GPU work); `lanes`: GPUs
    (evaluations measured at once); `build_jobs`: builds at once; `retries`: every retry so far.
    `profile` runs the agent's profiler on a GPU of the executor's, holding its lane like an
    evaluation (nothing is timed beside it); the profiler's text, or None.
    """

    slots: int
    lanes: int
    build_jobs: int
    retries: list[EvaluateRetry]

    def evaluate(self, path: Path, task: Task, config: EvalConfig, *, device_available: bool = True,
                 on_retry: RetryNote | None = None) -> Verdict: ...

    def device_available(self) -> bool: ...

    def profile(self, profiler: Profiler, path: Path, task: Task, config: EvalConfig) -> str | None: ...

    def close(self) -> None: ...


def device_available(config: EvalConfig) -> bool:
    """Whether the evaluation device is on this machine: without one, a candidate gets the stages
    this machine can run (split execution) instead of failing on the task's reference for want of
    CUDA."""
    if config.device != "cuda":
        return True
    import torch  # lazy: loading torch takes seconds

    return bool(torch.cuda.is_available())


class LocalExecutor:
    """This machine's evaluation service (the default). Nothing starts until the first evaluation."""

    def __init__(self, config: EvalConfig, *, build_jobs: int | None = None) -> None:
        self.config = config
        self.service = Evaluator.for_config(config, build_jobs=build_jobs)
        self.lanes = len(self.service.lanes)
        self.build_jobs = self.service.build_jobs
        self.slots = self.lanes + self.build_jobs  # candidates build in the pool while others hold a lane
        self.retries: list[EvaluateRetry] = []  # a local evaluation is never sent again

    def evaluate(self, path: Path, task: Task, config: EvalConfig, *, device_available: bool = True,
                 on_retry: RetryNote | None = None) -> Verdict:
        return evaluate_candidate(path, task, config, self.service, device_available=device_available)

    def device_available(self) -> bool:
        return device_available(self.config)

    def profile(self, profiler: Profiler, path: Path, task: Task, config: EvalConfig) -> str | None:
        with self.service.lane(task):
            return profiler(path, task, config)

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def make_executor(executor: ExecutorConfig | None, config: EvalConfig, *, build_jobs: int | None = None) -> Any:
    """The executor `executor` names (None: local), for evaluations under `config`."""
    if executor is None or executor.kind == "local":
        return LocalExecutor(config, build_jobs=build_jobs)

    return RayExecutor(executor, config, build_jobs=build_jobs)
