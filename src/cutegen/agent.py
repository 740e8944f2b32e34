"""The agent: one evolving kernel per task, through generate, repair and optimize stages.

Per task (a coroutine; tasks run concurrently, model calls limited by a semaphore, evaluations
handed to threads in front of the executor: this machine's evaluation service, which builds on the
CPU cores and queues the GPU work per GPU, so one candidate builds while another is measured, or one
such service per GPU of a Ray cluster; evaluate/executor.py):

    generate ──► candidate ──► evaluate ──► passed? ──yes──► optimize rounds
        ▲                          │ no
        │                 repair, up to N times (build error -> repair_build,
        │                 correctness / anti-cheat -> repair_correctness)
        └── all N failed: generate again (up to G times) from scratch

    optimize round r: ask for ONE optimization of the BEST correct kernel so far (not the latest),
    with workload-class guidance, and with profile feedback once the schedule allows it
    (none / immediate / delayed:K = withheld for the first K rounds); a failing result gets up to N
    repairs; the round gains when the result is correct and faster than the best by `min_gain`, or by
    the baseline's measured timing noise when that is larger.

    A task stops when its rounds are done, after `patience` rounds without gain, when the best kernel
    reaches `target_sol_fraction` of its speed-of-light bound, or when the run's budget (model calls,
    tokens, dollars, GPU seconds, wall time) is spent. A reply without a usable candidate is a failed
    attempt with its reason in the journal, never a silent end.

Resume is replay. The state machine is deterministic given the model's replies and the verdicts, and
both are in the journal: a resumed run walks the same path from the start, taking each reply from the
journal (keyed by request hash) and each verdict from it (keyed by candidate, task and evaluation
settings), so no recorded model call and no finished evaluation is repeated. The budget is checked
only before new spending. An evaluation the executor had to send again (its cluster node died) is
journaled as `evaluate_retry`; it still gives one step.

Exit statuses of a session (`Agent.run`, and the `cutegen optimize` / `cutegen resume` commands):
    0   every task finished (see the report for which found a correct kernel);
    75  EX_TEMPFAIL, waiting for replies: every unfinished task waits on an `exchange` reply file;
        write the reply files and run `cutegen resume RUN`;
    76  needs a GPU: an unfinished task has a candidate that passed every stage this machine can run
        (static checks and, with nvcc and a known architecture, the build: a build error is judged
        and repaired here) and this machine has no CUDA device; copy the run directory to a GPU
        machine and run `cutegen resume RUN` there (76 wins over 75: the GPU machine advances those
        tasks, then stops at 75 if replies are still missing).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cutegen import prompt
from cutegen.config import AgentConfig, EvalConfig, profiling_delay
from cutegen.errors import TaskError
from cutegen.extract import BadReply, extract_candidate
from cutegen.journal import Journal, eval_key, from_json
from cutegen.knowledge import pitfalls_for
from cutegen.llm.base import Provider, ProviderError, ReplyPending, request_sha256
from cutegen.records import Candidate, EvaluateRetry, Reply, Request, Step, Task, TaskResult, Verdict, to_json

EXIT_DONE = 0
EXIT_WAITING = 75
EXIT_NEEDS_GPU = 76

Profiler = Callable[[Path, Task, EvalConfig], "str | None"]
Progress = Callable[[TaskResult, str], None]
StepDone = Callable[[Step], None]


class _Halt(Exception):
    """Leaves a task's loop. status: "done", "waiting" (for a reply) or "needs_gpu"."""

    def __init__(self, status: str, reason: str) -> None:
        self.status, self.reason = status, reason
        super().__init__(f"{status}: {reason}")


@dataclass
class _Result:
    """What one step produced (a candidate and its verdict, or why there was none)."""

    candidate: Candidate | None
    verdict: Verdict | None
    bad_reply: str | None
    improved: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed


@dataclass
class _TaskState:
    task: Task
    trace: dict
    knowledge: str
    steps: int = 0
    calls: int = 0
    round: int = 0
    no_gain: int = 0
    best: _Result | None = None
    history: list[str] = field(default_factory=list)
    profile_due: bool = False  # the current optimize round shows the profile block
    profile: str | None = None  # its text (None: no profiler, the block says so)
    activity: str = "queued"
    halt: _Halt | None = None


class Agent:
    """Runs the workflow over tasks, recording every step in `journal`."""

    def __init__(
        self, journal: Journal, provider: Provider, config: AgentConfig, eval_config: EvalConfig, *,
        profiler: Profiler | None = None, gpu_available: Callable[[], bool] | None = None, executor: Any = None,
        on_progress: Progress | None = None, on_step: StepDone | None = None,
    ) -> None:
        self.journal, self.provider, self.cfg, self.eval_config = journal, provider, config, eval_config
        self.profiler = profiler
        self.gpu_available = gpu_available or (lambda: self.executor.device_available())
        # Where evaluations run (evaluate/executor.py); None: this machine's service, one per run.
        self.executor = executor
        self.on_progress, self.on_step = on_progress, on_step
        self.states: dict[str, _TaskState] = {}

    async def run(self, tasks: list[Task]) -> int:
        """Advance every task as far as it can go; the exit status (module docstring)."""
        self._calls = asyncio.Semaphore(self.cfg.concurrency)
        own = self.executor is None
        if own:  # no process starts until the first evaluation that is not in the journal
            from cutegen.evaluate.executor import LocalExecutor

            self.executor = LocalExecutor(self.eval_config)
        # Threads in front of the executor: more than its GPU lanes, so that candidates build in its CPU
        # pools while another holds a GPU.
        self._threads = ThreadPoolExecutor(max_workers=max(1, min(len(tasks), self.executor.slots)))
        try:
            halts = await asyncio.gather(*(self._run_task(task) for task in tasks))
        finally:
            self._threads.shutdown(wait=True)
            if own:
                self.executor.close()
                self.executor = None
        statuses = {halt.status for halt in halts}
        return EXIT_NEEDS_GPU if "needs_gpu" in statuses else EXIT_WAITING if "waiting" in statuses else EXIT_DONE

    async def _run_task(self, task: Task) -> _Halt:
        st = self.states[task.task_id] = self._new_state(task)
        try:
            try:
                await self._reach_correct(st)
                await self._optimize(st)
            except TaskError as err:  # the reference itself is broken: no candidate can be judged
                raise _Halt("done", f"task error: {err.problem}") from None
        except _Halt as halt:
            st.halt, st.activity = halt, halt.reason
            best = st.best.candidate.sha256 if st.best else None
            end = {"reason": halt.reason, "steps": st.steps, "best_sha256": best}
            last = self.journal.task_end(task.task_id)
            if halt.status == "done" and (last is None or {k: last.get(k) for k in end} != end):
                self.journal.append("task_end", task_id=task.task_id, **end)
            self._progress(st)
            return halt
        raise AssertionError("a task loop ends only by _Halt")

    # ------------------------------------------------------------------------------ the workflow

    async def _reach_correct(self, st: _TaskState) -> None:
        for _ in range(self.cfg.generations):
            result = await self._attempt(st, "generate")
            if result is not None:
                st.best = result
                return
        raise _Halt("done", f"no correct kernel after {self.cfg.generations} generation(s)"
                            f" with {self.cfg.repairs} repair(s) each")

    async def _optimize(self, st: _TaskState) -> None:
        while True:
            self._check_finished(st)
            st.round += 1
            st.profile_due = _profile_due(self.cfg.profiling, st.round)
            st.profile = await self._profile(st) if st.profile_due else None
            result = await self._attempt(st, "optimize")
            if result is not None and result.improved:
                st.best, st.no_gain = result, 0
            else:
                st.no_gain += 1
            st.history.append(_round_summary(st.round, result))

    async def _attempt(self, st: _TaskState, stage: str) -> _Result | None:
        """A new candidate from `stage` and up to N repairs of it: the first that passes, or None."""
        result = await self._step(st, stage, self._context(st, stage))
        subject = result if result.candidate is not None else None
        for attempt in range(1, self.cfg.repairs + 1):
            if result.passed:
                return result
            note = result.bad_reply
            if subject is None:  # no code to repair yet: ask again, saying why the reply was unusable
                result = await self._step(st, stage, self._context(st, stage, note=note))
            else:
                repair = prompt.repair_stage(subject.verdict)
                result = await self._step(st, repair, self._repair_context(st, subject, attempt, note))
            subject = result if result.candidate is not None else subject
        return result if result.passed else None

    def _check_finished(self, st: _TaskState) -> None:
        best = st.best.verdict
        if best.sol_fraction is not None and best.sol_fraction >= self.cfg.target_sol_fraction:
            raise _Halt("done", f"best kernel at {best.sol_fraction:.0%} of speed of light")
        if st.round >= self.cfg.rounds:
            raise _Halt("done", f"{self.cfg.rounds} optimization round(s) done")
        if st.no_gain >= self.cfg.patience:
            raise _Halt("done", f"{st.no_gain} round(s) without gain")

    # ------------------------------------------------------------------------------ one step

    async def _step(self, st: _TaskState, stage: str, context: dict) -> _Result:
        messages = prompt.messages(stage, backend=self.eval_config.backend, track=self.eval_config.track, **context)
        request = Request(messages, self.cfg.max_tokens, st.task.task_id, stage, st.calls)
        st.calls += 1
        st.activity = f"{stage} (round {st.round})" if st.round else stage
        self._progress(st)
        reply, prompt_path, reply_path = await self._call(st, request)
        index, st.steps = st.steps, st.steps + 1
        step = dict(task_id=st.task.task_id, index=index, stage=stage, round=st.round,
                    request_sha256=reply.request_sha256, prompt_path=prompt_path, reply_path=reply_path,
                    profile_shown=bool(context.get("profile_due")))
        try:
            candidate = extract_candidate(reply.text, truncated=reply.truncated)
        except BadReply as bad:
            self._record(Step(**step, candidate_sha256=None, candidate_path=None, bad_reply=bad.reason,
                              verdict=None, eval_key=None))
            return _Result(None, None, bad.reason)
        verdict, key, path = await self._evaluate(st, candidate)
        improved = verdict.passed and (st.best is None or _faster(verdict, st.best.verdict, self.cfg.min_gain))
        log_path = self.journal.put_text("logs", verdict.log_tail, ".txt") if verdict.log_tail else None
        self._record(Step(**step, candidate_sha256=candidate.sha256, candidate_path=path, bad_reply=None,
                          verdict=verdict, eval_key=key, improved=improved, log_path=log_path))
        return _Result(candidate, verdict, None, improved)

    async def _call(self, st: _TaskState, request: Request) -> tuple[Reply, str, str | None]:
        """The reply to `request`: from the journal when recorded, else from the provider."""
        rid = request_sha256(request, self.provider.model_id)
        prompt_path = self.journal.put_text("prompts", json.dumps(to_json(request.messages), indent=1), ".json")
        record = self.journal.reply(rid)
        if record is None:
            self._check_budget()
            try:
                async with self._calls:
                    reply = await self.provider.complete(request)
            except ReplyPending as pending:
                raise _Halt("waiting", f"waiting for reply file {pending.path.name}") from None
            except ProviderError as err:
                record = self.journal.append("reply", task_id=st.task.task_id, stage=request.stage, seq=request.seq,
                                             request_sha256=rid, prompt_path=prompt_path, reply_path=None,
                                             reply=None, error=str(err))
            else:
                reply_path = self.journal.put_text("replies", reply.text, ".md")
                record = self.journal.append("reply", task_id=st.task.task_id, stage=request.stage, seq=request.seq,
                                             request_sha256=rid, prompt_path=prompt_path, reply_path=reply_path,
                                             reply=reply, error=None)
        if record.get("error"):
            raise _Halt("done", f"provider error: {record['error']}")
        return from_json(Reply, record["reply"]), prompt_path, record["reply_path"]

    async def _evaluate(self, st: _TaskState, candidate: Candidate) -> tuple[Verdict, str, str]:
        """The verdict on `candidate`: from the journal when this evaluation finished before."""
        key = eval_key(candidate.sha256, st.task.source_sha256, self.eval_config)
        path = self.journal.put_text("candidates", candidate.source, ".py", sha256=candidate.sha256)
        verdict = self.journal.verdict(key)
        if verdict is None:
            self._check_budget(only="GPU seconds")  # the reply is paid for: judge it unless the GPU budget is spent
            st.activity = f"evaluating (round {st.round})" if st.round else "evaluating"
            self._progress(st)
            verdict = await asyncio.get_running_loop().run_in_executor(
                self._threads, self._evaluate_recorded, key, candidate, path, st.task)
            if verdict is None:
                raise _Halt("needs_gpu", f"a built candidate waits for a GPU (backend {self.eval_config.backend},"
                                         f" device {self.eval_config.device})")
        return verdict, key, path

    def _evaluate_recorded(self, key: str, candidate: Candidate, path: str, task: Task) -> Verdict | None:
        """The verdict, or None when the candidate passed what this machine can run and needs a GPU
        (split execution: static checks and the build run here; a failure there is a verdict)."""
        from cutegen.evaluate.pipeline import NeedsDevice

        available = self.gpu_available()
        if available:
            # The `evaluate` record marks an evaluation as started: one without a later step is the one
            # a kill interrupted (and the only kind a resume runs again).
            self.journal.append("evaluate", task_id=task.task_id, eval_key=key, candidate_sha256=candidate.sha256)

        def on_retry(retry: EvaluateRetry) -> None:
            self.journal.append("evaluate_retry", eval_key=key, **to_json(retry))

        try:
            return self.executor.evaluate(self.journal.run_dir / path, task, self.eval_config,
                                          device_available=available, on_retry=on_retry)
        except NeedsDevice:
            return None

    def _record(self, step: Step) -> None:
        if not self.journal.has_step(step.task_id, step.index):  # replayed steps are already there
            self.journal.append("step", **to_json(step))
            if self.on_step is not None:
                self.on_step(step)

    def _check_budget(self, only: str | None = None) -> None:
        """Before new spending: stop the task when a run-wide limit is reached."""
        budget, spent = self.cfg.budget, self.journal.totals()
        limits = (("model calls", budget.llm_calls, spent["llm_calls"]),
                  ("tokens", budget.tokens, spent["input_tokens"] + spent["output_tokens"]),
                  ("dollars", budget.usd, spent["cost_usd"]), ("GPU seconds", budget.gpu_s, spent["gpu_s"]),
                  ("wall seconds", budget.wall_s, spent["wall_s"]))
        for name, limit, used in limits:
            if limit is not None and used >= limit and only in (None, name):
                raise _Halt("done", f"budget spent: {used:.4g} of {limit:.4g} {name}")

    # ------------------------------------------------------------------------------ prompts

    def _context(self, st: _TaskState, stage: str, note: str | None = None) -> dict:
        context = {"task_id": st.task.task_id, "reference_source": st.task.source.strip(),
                   "knowledge": st.knowledge, "note": note, **st.trace}
        if stage == "optimize":
            context.update(best_source=st.best.candidate.source.strip(),
                           measurements=prompt.measurements(st.best.verdict), round=st.round,
                           rounds=self.cfg.rounds, history=list(st.history), profile_due=st.profile_due,
                           profile_text=st.profile)
        return context

    def _repair_context(self, st: _TaskState, subject: _Result, attempt: int, note: str | None) -> dict:
        verdict = subject.verdict
        return {**self._context(st, "repair", note), "candidate_source": subject.candidate.source.strip(),
                "feedback": verdict.feedback.strip() or "(no details)", "failure": verdict.failure,
                "failed_stage": verdict.stage, "attempt": attempt, "max_attempts": self.cfg.repairs,
                # Known causes of the compiler messages in the feedback, from the pack's pitfalls.
                "pitfalls": pitfalls_for(verdict.feedback, folder=self.cfg.knowledge_dir)}

    async def _profile(self, st: _TaskState) -> str | None:
        """Profiler text for the best kernel, produced once per kernel (None: no profiler here)."""
        if self.profiler is None:
            return None
        key = eval_key(st.best.candidate.sha256, st.task.source_sha256, self.eval_config)
        record = self.journal.profile(key)
        if record is None:
            path = self.journal.run_dir / f"candidates/{st.best.candidate.sha256}.py"
            started = time.monotonic()
            if not self.gpu_available():
                raise _Halt("needs_gpu", "the profile of the best kernel needs a GPU")
            text = await asyncio.get_running_loop().run_in_executor(self._threads, self._profile_on_lane, path,
                                                                    st.task)
            record = self.journal.append("profile", task_id=st.task.task_id, eval_key=key,
                                         candidate_sha256=st.best.candidate.sha256, text=text,
                                         gpu_s=round(time.monotonic() - started, 3))
        return record["text"]

    def _profile_on_lane(self, path: Path, task: Task) -> str | None:
        """The profiler holds a GPU lane of the executor like an evaluation: nothing is timed beside it."""
        return self.executor.profile(self.profiler, path, task, self.eval_config)

    # ------------------------------------------------------------------------------ state

    def _new_state(self, task: Task) -> _TaskState:
        from cutegen.knowledge import select_knowledge, task_dtypes
        from cutegen.trace import trace_task

        trace = prompt.trace_context(trace_task(task))
        knowledge = select_knowledge(trace["workload_class"], trace["aten_ops"], dtypes=task_dtypes(task),
                                     track=self.eval_config.track, folder=self.cfg.knowledge_dir,
                                     backend=self.eval_config.backend)
        return _TaskState(task=task, trace=trace, knowledge=knowledge)

    def result(self, task_id: str) -> TaskResult:
        """Where a task stands now, with what it has cost."""
        st = self.states[task_id]
        spent = self.journal.totals(task_id)
        best = st.best.verdict if st.best else None
        status = st.halt.status if st.halt else "running"
        return TaskResult(
            task_id=task_id, status=status, stop_reason=st.halt.reason if st.halt else None,
            best_sha256=st.best.candidate.sha256 if st.best else None,
            best_median_ms=best.timing.median_ms if best and best.timing else None,
            speedup_vs_eager=best.speedup_vs_eager if best else None,
            speedup_vs_compile=best.speedup_vs_compile if best else None,
            sol_fraction=best.sol_fraction if best else None, steps=st.steps, rounds=st.round,
            llm_calls=int(spent["llm_calls"]), input_tokens=int(spent["input_tokens"]),
            output_tokens=int(spent["output_tokens"]), cost_usd=spent["cost_usd"], gpu_s=spent["gpu_s"],
        )

    def _progress(self, st: _TaskState) -> None:
        if self.on_progress is not None:
            self.on_progress(self.result(st.task.task_id), st.activity)


def _profile_due(schedule: str, round_number: int) -> bool:
    """Whether optimize round `round_number` (1-based) shows the profile: never with "none", from
    round 1 with "immediate", from round K+1 with "delayed:K"."""
    delay = profiling_delay(schedule)
    return delay is not None and round_number > delay


def required_gain(new: Verdict, best: Verdict, min_gain: float) -> float:
    """The relative gain that counts: `min_gain`, or the baseline's measured timing noise when that is
    larger (a difference within the spread of two identical measurements is not a gain)."""
    noise = max((v.noise_pct or 0.0) for v in (new, best)) / 100.0
    return max(min_gain, noise)


def _faster(new: Verdict, best: Verdict, min_gain: float) -> bool:
    """`new` beats `best` by more than `required_gain` (relative), by median time, else by eager speedup."""
    gain = required_gain(new, best, min_gain)
    if new.timing is not None and best.timing is not None:
        return new.timing.median_ms < best.timing.median_ms * (1.0 - gain)
    if new.speedup_vs_eager is not None and best.speedup_vs_eager is not None:
        return new.speedup_vs_eager > best.speedup_vs_eager * (1.0 + gain)
    return False


def _round_summary(round_number: int, result: _Result | None) -> str:
    if result is None:
        return f"round {round_number}: no correct kernel came out of it (the best was kept)"
    measured = prompt.measurements(result.verdict).rstrip(".")
    verdict = "new best" if result.improved else "correct but not faster than the best (discarded)"
    return f"round {round_number}: {verdict}; {measured}"
