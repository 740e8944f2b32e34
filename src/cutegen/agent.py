"""The agent: a tree of kernels per task, grown through generate, repair and optimize stages.

Per task (a coroutine; tasks run concurrently, model calls limited by a semaphore, evaluations
handed to threads in front of the executor: this machine's evaluation service, which builds on the
CPU cores and queues the GPU work per GPU, so one candidate builds while another is measured, or one
such service per GPU of a Ray cluster; evaluate/executor.py):

    generate ──► candidate ──► evaluate ──► passed? ──yes──► optimize rounds
        ▲                          │ no
        │                 repair, up to N times (build error -> repair_build,
        │                 correctness / anti-cheat -> repair_correctness)
        └── all N failed: generate again (up to G times) from scratch

    optimize round r: ask for ONE optimization of a kept correct kernel (the BEST so far, not the
    latest), with workload-class guidance, the ideas already tried on the task and their outcomes,
    and profile feedback once the schedule allows it (none / immediate / delayed:K = withheld for the
    first K rounds); a failing result gets up to N repairs; the round gains when the best kernel
    became faster by `min_gain`, or by the baseline's measured timing noise when that is larger.

Search (AgentConfig.search, config.SearchPolicy) is a policy over that tree, not another loop: a
batch of plans runs side by side in lockstep (`_attempts`). `single` has one plan per batch;
`best-of:N` asks N generations at once and keeps the best correct one; `beam:W,K` keeps the W best
kernels and asks K proposals from each per round, each in a direction of its own (one short
`directions` call per kept kernel lists K different ones) and told the directions in flight. Within a
batch every call is asked in plan order (so request ids, step indices and replayed replies do not
depend on timing), the evaluations overlap, and the passing results join the kept kernels in step
order once all have finished. Each step records its parent candidate, the direction it was given and
the idea the model says it tried (`Step`): the journal holds the tree.

    A task stops when its rounds are done, after `patience` rounds without gain, when the best kernel
    reaches `target_sol_fraction` of the reference algorithm's work bound while faster than both
    baselines (`target_reached`: a kernel near the bound but slower than torch.compile goes on being
    optimized), or when the run's budget (model calls, tokens, dollars, GPU seconds, wall time) is
    spent. The reason is the journal's `task_end` record and the reports' "stopped because". A reply
    without a usable candidate is a failed attempt with its reason in the journal, never a silent end.

The kernel library (library.py), when the run uses one, adds to each task's generate and optimize
prompts the verified kernels of the most similar other tasks (chosen when the task first starts and
journaled, so a resume shows the same), and takes every accepted kernel as soon as its step is journaled.

Resume is replay. The state machine is deterministic given the model's replies and the verdicts, and
both are in the journal: a resumed run walks the same path from the start, taking each reply from the
journal (keyed by request hash) and each verdict from it (keyed by candidate, task and evaluation
settings), so no recorded model call and no finished evaluation is repeated. The budget is checked
only before new spending; calls in flight count as spent, so a batch stops at the call limit exactly.
An evaluation the executor had to send again (its cluster node died), or that ended in a verdict
that is not one on the candidate (`Verdict.infrastructure`: judged again, INFRASTRUCTURE_RETRIES
times at most), is journaled as `evaluate_retry`; it still gives one step.

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
from cutegen.evaluate.executor import LocalExecutor
from cutegen.evaluate.pipeline import NeedsDevice
from cutegen.evaluate.verdict import faster
from cutegen.extract import BadReply, extract_candidate, idea_of
from cutegen.journal import Journal, eval_key
from cutegen.knowledge import pitfalls_for, select_knowledge, task_dtypes
from cutegen.library import examples_for_task, provenance, task_signature
from cutegen.llm.base import Provider, ProviderError, ReplyPending, request_sha256
from cutegen.records import (
    Candidate, EvaluateRetry, Reply, Request, Step, Task, TaskResult, Verdict, from_json, to_json,
)
from cutegen.trace import trace_task

EXIT_DONE = 0
EXIT_WAITING = 75
EXIT_NEEDS_GPU = 76
# Evaluations sent again after a verdict that is not one on the candidate (Verdict.infrastructure).
# One: the evaluator has already waited for a shared GPU inside it (contention.py), so a second such
# verdict is the machine's state, which the model then hears of as that verdict says.
INFRASTRUCTURE_RETRIES = 1

Profiler = Callable[[Path, Task, EvalConfig], "str | None"]
Progress = Callable[[TaskResult, str], None]
StepDone = Callable[[Step], None]


class _Halt(Exception):
    """Leaves a task's loop. status: "done", "waiting" (for a reply) or "needs_gpu"."""

    def __init__(self, status: str, reason: str) -> None:
        self.status, self.reason = status, reason
        super().__init__(f"{status}: {reason}")


_PRESSING = ("needs_gpu", "waiting", "done")  # which halt of a batch ends the task (module docstring)


def _most_pressing(halts: list[_Halt]) -> _Halt:
    return min(halts, key=lambda halt: _PRESSING.index(halt.status))


@dataclass
class _Result:
    """What one step produced (a candidate and its verdict, or why there was none, or the halt met)."""

    candidate: Candidate | None
    verdict: Verdict | None
    bad_reply: str | None
    improved: bool = False
    index: int | None = None  # the step's index within the task
    idea: str | None = None  # the model's one-line summary of its change
    halt: _Halt | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed


@dataclass(frozen=True)
class _Plan:
    """One line of work in a batch: a stage asked from a kept kernel (None: from scratch)."""

    stage: str  # "generate", "optimize" or "directions"
    parent: _Result | None = None
    direction: str | None = None
    in_flight: tuple[str, ...] = ()  # the directions of the other proposals of the round
    label: str = ""  # where the idea memory places it: ", proposal 2 of 4 (from 1a2b3c4d)"


@dataclass
class _Attempt:
    """A plan, its own reply and its repairs so far."""

    plan: _Plan
    first: _Result  # the plan's own reply: its idea
    last: _Result  # the latest step: the passing one, or the last failure
    subject: _Result | None = None  # the latest candidate, which a repair fixes (None: no code yet)
    repairs: int = 0


@dataclass
class _TaskState:
    task: Task
    trace: dict
    knowledge: str
    tolerances: tuple = ()  # (output dtype, tolerance) pairs for the system prompt
    steps: int = 0  # steps made (recorded or replayed)
    next_index: int = 0  # index of the next step: given when its call is asked, so batch order
    calls: int = 0
    round: int = 0
    no_gain: int = 0
    beam: list[_Result] = field(default_factory=list)  # the kept correct kernels, the best first
    ideas: list[str] = field(default_factory=list)  # ideas tried and their outcomes, oldest first
    profile_due: bool = False  # the current optimize round shows the profile block
    profile: str | None = None  # its text (None: no profiler, the block says so)
    activity: str = "queued"
    halt: _Halt | None = None
    signature: Any = None  # records.TaskSignature, when a kernel library is used
    examples: tuple = ()  # the library's verified kernels of similar tasks its prompts show (journaled)

    @property
    def best(self) -> _Result | None:
        return self.beam[0] if self.beam else None


class Agent:
    """Runs the workflow over tasks, recording every step in `journal`."""

    def __init__(
        self, journal: Journal, provider: Provider, config: AgentConfig, eval_config: EvalConfig, *,
        profiler: Profiler | None = None, gpu_available: Callable[[], bool] | None = None, executor: Any = None,
        on_progress: Progress | None = None, on_step: StepDone | None = None, library: Any = None,
    ) -> None:
        self.journal, self.provider, self.cfg, self.eval_config = journal, provider, config, eval_config
        self.policy = config.policy
        self.profiler = profiler
        self.gpu_available = gpu_available or (lambda: self.executor.device_available())
        # Where evaluations run (evaluate/executor.py); None: this machine's service, one per run.
        self.executor = executor
        self.on_progress, self.on_step = on_progress, on_step
        # library.KernelLibrary: examples for the prompts, and every accepted kernel added (None: neither).
        self.library = library if config.library else None
        self.states: dict[str, _TaskState] = {}
        self._calls_in_flight = 0  # new model calls asked and not yet recorded: spent for the budget
        self._evaluations: dict[str, asyncio.Future] = {}  # this session's evaluations by key: one per candidate

    async def run(self, tasks: list[Task]) -> int:
        """Advance every task as far as it can go; the exit status (module docstring)."""
        self._calls = asyncio.Semaphore(self.cfg.concurrency)
        own = self.executor is None
        if own:  # no process starts until the first evaluation that is not in the journal
            self.executor = LocalExecutor(self.eval_config)
        # Threads in front of the executor: more than its GPU lanes, so that candidates build in its CPU
        # pools while another holds a GPU; a batch of side-by-side proposals needs one each.
        in_flight = len(tasks) * self.policy.parallel
        self._threads = ThreadPoolExecutor(max_workers=max(1, min(in_flight, self.executor.slots)))
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
            await self._attempts(st, [_Plan("generate")] * self.policy.starts)
            if st.beam:
                return
        raise _Halt("done", f"no correct kernel after {self.cfg.generations} generation(s)"
                            f" with {self.cfg.repairs} repair(s) each")

    async def _optimize(self, st: _TaskState) -> None:
        while True:
            self._check_finished(st)
            st.round += 1
            st.profile_due = _profile_due(self.cfg.profiling, st.round)
            st.profile = await self._profile(st) if st.profile_due else None
            best = st.best
            attempts = await self._attempts(st, await self._proposals(st))
            st.no_gain = 0 if st.best is not best else st.no_gain + 1
            st.ideas.extend(f"round {st.round}{a.plan.label}: {self._outcome(st, a)} — idea: "
                            f"{a.first.idea or '(not stated)'}" for a in attempts)

    async def _proposals(self, st: _TaskState) -> list[_Plan]:
        """The round's plans: K proposals from each kept kernel. With K > 1 each gets a direction of its
        own (from one short `directions` call per kept kernel, side by side) and the others' directions."""
        parents, k = list(st.beam), self.policy.proposals
        directions = await self._directions(st, parents) if k > 1 else [[] for _ in parents]
        everyone = [d for listed in directions for d in listed]
        total, plans = len(parents) * k, []
        for parent, listed in zip(parents, directions):
            origin = f" (from {parent.candidate.sha256[:8]})" if len(parents) > 1 else ""
            for j in range(k):
                mine = listed[j] if j < len(listed) else None
                label = f", proposal {len(plans) + 1} of {total}{origin}" if total > 1 else ""
                plans.append(_Plan("optimize", parent, mine, tuple(d for d in everyone if d != mine), label))
        return plans

    async def _directions(self, st: _TaskState, parents: list[_Result]) -> list[list[str]]:
        """K different directions for each kept kernel, most promising first (fewer when the reply lists
        fewer: those proposals choose their own). No candidate comes of it, so no step is recorded."""
        requests = [self._request(st, "directions", self._context(st, "directions", _Plan("directions", parent)))
                    for parent in parents]
        replies = await self._gather([self._call(st, request) for request in requests])
        return [prompt.parse_directions(reply.text, self.policy.proposals) for reply, _, _ in replies]

    async def _attempts(self, st: _TaskState, plans: list[_Plan]) -> list[_Attempt]:
        """Each plan's new candidate and up to N repairs of it, the plans side by side in lockstep (each
        batch of calls asked in plan order). The passing results join the kept kernels in step order;
        then a halt met by any plan ends the task (the others' paid replies judged first)."""
        firsts = await self._batch(st, [(p.stage, self._context(st, p.stage, p), p.parent, p.direction)
                                        for p in plans])
        attempts = [_Attempt(p, r, r, r if r.candidate else None) for p, r in zip(plans, firsts)]
        for number in range(1, self.cfg.repairs + 1):
            needy = [a for a in attempts if not a.last.passed and a.last.halt is None]
            if not needy:
                break
            for a, result in zip(needy, await self._batch(st, [self._retry(st, a, number) for a in needy])):
                if a.subject is None:  # asked again from scratch: this reply is the plan's own
                    a.first = result
                a.last, a.repairs = result, number
                a.subject = result if result.candidate is not None else a.subject
        self._admit(st, sorted((a.last for a in attempts if a.last.passed), key=lambda r: r.index))
        halts = [a.last.halt for a in attempts if a.last.halt is not None]
        if halts:
            raise _most_pressing(halts)
        return attempts

    def _retry(self, st: _TaskState, a: _Attempt, number: int) -> tuple:
        """The next call of a failed attempt: the plan asked again, saying why its reply was unusable,
        when there is no code yet; else a repair of the latest candidate."""
        note = a.last.bad_reply
        if a.subject is None:
            return a.plan.stage, self._context(st, a.plan.stage, a.plan, note), a.plan.parent, a.plan.direction
        repair = prompt.repair_stage(a.subject.verdict)
        return repair, self._repair_context(st, a.subject, number, note), a.subject, None

    def _admit(self, st: _TaskState, results: list[_Result]) -> None:
        """Passing results join the kept kernels, in step order: one faster than the best by the
        required gain becomes the best; another takes a free place, or the slowest's place when faster
        than it by that gain. Single and best-of keep one kernel: today's "replace the best if faster"."""
        for result in results:
            if any(kept.candidate.sha256 == result.candidate.sha256 for kept in st.beam):
                continue
            if not st.beam or faster(result.verdict, st.beam[0].verdict, self.cfg.min_gain):
                st.beam.insert(0, result)
            elif len(st.beam) < self.policy.width or faster(result.verdict, st.beam[-1].verdict, self.cfg.min_gain):
                st.beam.append(result)
            else:
                continue
            st.beam[1:] = sorted(st.beam[1:], key=_median_ms)
            del st.beam[self.policy.width:]

    def _outcome(self, st: _TaskState, a: _Attempt) -> str:
        """What became of an idea, in the words of the idea memory."""
        last, after = a.last, f" after {a.repairs} repair(s)" if a.repairs else ""
        if last.passed:
            ratio = _speed_ratio(a.plan.parent.verdict, last.verdict)
            speed = f"{ratio:.2f}x the speed of its starting kernel; " if ratio else ""
            kept = "kept by the search" if any(k is last for k in st.beam) else "discarded"
            if last is st.best:
                verdict = "new best"
            elif last.improved:  # beat the best it started from, but a sibling of its round beat it
                verdict = f"faster than the best, but another proposal was faster ({kept})"
            else:
                verdict = f"correct but not faster than the best ({kept})"
            return f"{verdict}{after}: {speed}{prompt.measurements(last.verdict).rstrip('.')}"
        if last.verdict is None:
            return f"no usable reply{after}" + (f": {last.bad_reply}" if last.bad_reply else "")
        kind = {"build": "build error", "correctness": "wrong results"}.get(last.verdict.stage,
                                                                          f"rejected at {last.verdict.stage}")
        return f"{kind}{after}" + (f" ({last.verdict.failure})" if last.verdict.failure else "")

    def _check_finished(self, st: _TaskState) -> None:
        reached = target_reached(st.best.verdict, self.cfg.target_sol_fraction)
        if reached is not None:
            raise _Halt("done", reached)
        if st.round >= self.cfg.rounds:
            raise _Halt("done", f"{self.cfg.rounds} optimization round(s) done")
        if st.no_gain >= self.cfg.patience:
            raise _Halt("done", f"{st.no_gain} round(s) without gain")

    # ------------------------------------------------------------------------------ one step

    async def _batch(self, st: _TaskState, asks: list[tuple]) -> list[_Result]:
        """(stage, context, parent, direction) steps side by side; each call is asked (and its step
        index given) in list order before any reply is awaited."""
        return await self._gather([self._step(st, *ask) for ask in asks])

    async def _gather(self, coroutines: list) -> list:
        """Run side by side until every one has finished (a paid reply is recorded, a started
        evaluation ends); then a halt, the most pressing first, or another error, is raised."""
        outcomes = await asyncio.gather(*coroutines, return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        bugs = [e for e in errors if not isinstance(e, _Halt)]
        if bugs:
            raise bugs[0]
        if errors:
            raise _most_pressing(errors)
        return outcomes

    def _request(self, st: _TaskState, stage: str, context: dict) -> Request:
        messages = prompt.messages(stage, backend=self.eval_config.backend, track=self.eval_config.track,
                                   tolerances=st.tolerances, **context)
        request = Request(messages, self.cfg.max_tokens, st.task.task_id, stage, st.calls)
        st.calls += 1
        return request

    async def _step(self, st: _TaskState, stage: str, context: dict, parent: _Result | None = None,
                    direction: str | None = None) -> _Result:
        request = self._request(st, stage, context)
        index, st.next_index = st.next_index, st.next_index + 1
        st.activity = f"{stage} (round {st.round})" if st.round else stage
        self._progress(st)
        try:
            reply, prompt_path, reply_path = await self._call(st, request)
            st.steps += 1
            idea = idea_of(reply.text)
            step = dict(task_id=st.task.task_id, index=index, stage=stage, round=st.round,
                        request_sha256=reply.request_sha256, prompt_path=prompt_path, reply_path=reply_path,
                        profile_shown=bool(context.get("profile_due")), idea=idea, direction=direction,
                        parent_sha256=parent.candidate.sha256 if parent and parent.candidate else None)
            try:
                candidate = extract_candidate(reply.text, truncated=reply.truncated)
            except BadReply as bad:
                self._record(Step(**step, candidate_sha256=None, candidate_path=None, bad_reply=bad.reason,
                                  verdict=None, eval_key=None))
                return _Result(None, None, bad.reason, index=index, idea=idea)
            verdict, key, path = await self._evaluate(st, candidate)
        except _Halt as halt:
            return _Result(None, None, None, index=index, halt=halt)
        # Against the best the batch started from: the batch's results join the kept kernels together.
        improved = verdict.passed and (st.best is None or faster(verdict, st.best.verdict, self.cfg.min_gain))
        log_path = self.journal.put_text("logs", verdict.log_tail, ".txt") if verdict.log_tail else None
        self._record(Step(**step, candidate_sha256=candidate.sha256, candidate_path=path, bad_reply=None,
                          verdict=verdict, eval_key=key, improved=improved, log_path=log_path))
        return _Result(candidate, verdict, None, improved, index=index, idea=idea)

    async def _call(self, st: _TaskState, request: Request) -> tuple[Reply, str, str | None]:
        """The reply to `request`: from the journal when recorded, else from the provider."""
        rid = request_sha256(request, self.provider.model_id)
        prompt_path = self.journal.put_text("prompts", json.dumps(to_json(request.messages), indent=1), ".json")
        record = self.journal.reply(rid) or await self._new_call(st, request, rid, prompt_path)
        if record.get("error"):
            raise _Halt("done", f"provider error: {record['error']}")
        return from_json(Reply, record["reply"]), prompt_path, record["reply_path"]

    async def _new_call(self, st: _TaskState, request: Request, rid: str, prompt_path: str) -> dict:
        """Ask the provider (when the budget allows) and record the reply before anything else."""
        self._check_budget()
        self._calls_in_flight += 1  # counted before the await: the next call of a batch sees it
        try:
            try:
                async with self._calls:
                    reply = await self.provider.complete(request)
            except ReplyPending as pending:
                raise _Halt("waiting", f"waiting for reply file {pending.path.name}") from None
            except ProviderError as err:
                return self.journal.append("reply", task_id=st.task.task_id, stage=request.stage, seq=request.seq,
                                           request_sha256=rid, prompt_path=prompt_path, reply_path=None,
                                           reply=None, error=str(err))
            reply_path = self.journal.put_text("replies", reply.text, ".md")
            return self.journal.append("reply", task_id=st.task.task_id, stage=request.stage, seq=request.seq,
                                       request_sha256=rid, prompt_path=prompt_path, reply_path=reply_path,
                                       reply=reply, error=None)
        finally:
            self._calls_in_flight -= 1

    async def _evaluate(self, st: _TaskState, candidate: Candidate) -> tuple[Verdict, str, str]:
        """The verdict on `candidate`: from the journal when this evaluation finished before, shared
        with a batch sibling that gave the same candidate."""
        key = eval_key(candidate.sha256, st.task.source_sha256, self.eval_config)
        path = self.journal.put_text("candidates", candidate.source, ".py", sha256=candidate.sha256)
        verdict = self.journal.verdict(key)
        if verdict is None:
            if key not in self._evaluations:
                self._check_budget(only="GPU seconds")  # the reply is paid for: judge it unless the GPU budget is spent
                st.activity = f"evaluating (round {st.round})" if st.round else "evaluating"
                self._progress(st)
                self._evaluations[key] = asyncio.get_running_loop().run_in_executor(
                    self._threads, self._evaluate_recorded, key, candidate, path, st.task)
            verdict = await self._evaluations[key]
            if verdict is None:
                raise _Halt("needs_gpu", f"a built candidate waits for a GPU (backend {self.eval_config.backend},"
                                         f" device {self.eval_config.device})")
        return verdict, key, path

    def _evaluate_recorded(self, key: str, candidate: Candidate, path: str, task: Task) -> Verdict | None:
        """The verdict, or None when the candidate passed what this machine can run and needs a GPU
        (split execution: static checks and the build run here; a failure there is a verdict)."""

        available = self.gpu_available()
        if available:
            # The `evaluate` record marks an evaluation as started: one without a later step is the one
            # a kill interrupted (and the only kind a resume runs again).
            self.journal.append("evaluate", task_id=task.task_id, eval_key=key, candidate_sha256=candidate.sha256)

        def on_retry(retry: EvaluateRetry) -> None:
            self.journal.append("evaluate_retry", eval_key=key, **to_json(retry))

        try:
            for attempt in range(INFRASTRUCTURE_RETRIES + 1):
                if attempt:
                    # Not a verdict on the candidate (a GPU shared past the evaluator's own waits, a blind
                    # profiler, a failed reference process): judged again before the model is told it failed.
                    on_retry(EvaluateRetry(task.task_id, candidate.sha256, attempt,
                                           f"{verdict.failure}: not a verdict on the candidate", "the evaluator"))
                verdict = self.executor.evaluate(self.journal.run_dir / path, task, self.eval_config,
                                                 device_available=available, on_retry=on_retry)
                if not verdict.infrastructure:
                    break
            return verdict
        except NeedsDevice:
            return None

    def _record(self, step: Step) -> None:
        if not self.journal.has_step(step.task_id, step.index):  # replayed steps are already there
            self.journal.append("step", **to_json(step))
            if self.library is not None and step.verdict is not None and step.verdict.passed:
                self._add_to_library(step)
            if self.on_step is not None:
                self.on_step(step)

    def _check_budget(self, only: str | None = None) -> None:
        """Before new spending: stop the task when a run-wide limit is reached (calls asked and not yet
        answered count as spent; tokens, dollars and GPU seconds count when recorded)."""
        budget, spent = self.cfg.budget, self.journal.totals()
        limits = (("model calls", budget.llm_calls, spent["llm_calls"] + self._calls_in_flight),
                  ("tokens", budget.tokens, spent["input_tokens"] + spent["output_tokens"]),
                  ("dollars", budget.usd, spent["cost_usd"]), ("GPU seconds", budget.gpu_s, spent["gpu_s"]),
                  ("wall seconds", budget.wall_s, spent["wall_s"]))
        for name, limit, used in limits:
            if limit is not None and used >= limit and only in (None, name):
                raise _Halt("done", f"budget spent: {used:.4g} of {limit:.4g} {name}")

    # ------------------------------------------------------------------------------ prompts

    def _context(self, st: _TaskState, stage: str, plan: _Plan | None = None, note: str | None = None) -> dict:
        context = {"task_id": st.task.task_id, "reference_source": st.task.source.strip(),
                   "knowledge": st.knowledge, "note": note, "examples": st.examples, **st.trace}
        if stage in ("optimize", "directions"):
            parent = plan.parent
            rank = next(i for i, kept in enumerate(st.beam, 1) if kept is parent)
            context.update(best_source=parent.candidate.source.strip(),
                           measurements=prompt.measurements(parent.verdict), round=st.round, rounds=self.cfg.rounds, history=_recent(st.ideas),
                           profile_due=st.profile_due and rank == 1, profile_text=st.profile, rank=rank,
                           direction=plan.direction, in_flight=list(plan.in_flight), count=self.policy.proposals)
        return context

    def _repair_context(self, st: _TaskState, subject: _Result, attempt: int, note: str | None) -> dict:
        verdict = subject.verdict
        return {**self._context(st, "repair", note=note), "candidate_source": subject.candidate.source.strip(),
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
        traced = trace_task(task)
        trace = prompt.trace_context(traced)
        knowledge = select_knowledge(trace["workload_class"], trace["aten_ops"], dtypes=task_dtypes(task),
                                     track=self.eval_config.track, folder=self.cfg.knowledge_dir,
                                     backend=self.eval_config.backend)
        tolerances = prompt.tolerances(self.eval_config, tuple(trace["output_dtypes"]))
        st = _TaskState(task=task, trace=trace, knowledge=knowledge, tolerances=tolerances)
        if self.library is not None:
            st.signature = task_signature(task, traced)
            st.examples = examples_for_task(self.journal, task, st.signature, self.library, k=self.cfg.library_examples,
                                            same_task=self.cfg.library_same_task, backend=self.eval_config.backend,
                                            track=self.eval_config.track)
        return st

    def _add_to_library(self, step: Step) -> None:
        """An accepted kernel joins the library as soon as its step is journaled (a killed run keeps it)."""

        run = self.journal.run_record()
        st = self.states[step.task_id]
        self.library.add_verdict(st.task, st.signature, self.journal.read_text(step.candidate_path), step.verdict,
                                 provenance("agent", run.get("model"), run.get("run_id")))

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


def target_reached(verdict: Verdict, target: float) -> str | None:
    """The stop reason when `verdict` meets the target, else None: at least `target` of the reference
    algorithm's work bound and faster than the faster baseline measured (eager, torch.compile). The
    bound alone is not enough: torch.compile can run a task faster than a kernel at 91% of the bound,
    and a stop there would hand back a kernel slower than torch.compile. With no baseline measured the
    target never stops a task (nothing shows the kernel is worth having)."""
    if verdict.sol_fraction is None or verdict.sol_fraction < target or verdict.timing is None:
        return None
    measured = [(stats.median_ms, name) for name, stats in (("eager", verdict.eager),
                                                            ("torch.compile", verdict.compiled)) if stats is not None]
    if not measured:
        return None
    baseline_ms, name = min(measured)
    if verdict.timing.median_ms >= baseline_ms:
        return None
    return (f"target reached: best kernel at {verdict.sol_fraction:.0%} of the reference algorithm's work bound"
            f" and {baseline_ms / verdict.timing.median_ms:.2f}x {name}, the faster baseline")


def _median_ms(result: _Result) -> float:
    timing = result.verdict.timing
    return timing.median_ms if timing is not None else float("inf")


def _speed_ratio(parent: Verdict, child: Verdict) -> float | None:
    """How many times faster `child` runs than `parent` (< 1: slower); None when either is untimed."""
    if parent.timing is None or child.timing is None or child.timing.median_ms <= 0:
        return None
    return parent.timing.median_ms / child.timing.median_ms


IDEAS_SHOWN = 40  # the idea memory a prompt carries: the latest ones (a long beam search tries many)


def _recent(ideas: list[str]) -> list[str]:
    if len(ideas) <= IDEAS_SHOWN:
        return list(ideas)
    return [f"({len(ideas) - IDEAS_SHOWN} earlier idea(s) not shown)"] + ideas[-IDEAS_SHOWN:]

