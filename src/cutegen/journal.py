"""The run journal: the only state of an agent run, append-only, replayed to resume.

Layout of a run directory (every path in a record is relative to it, so the folder can be moved or
copied to another machine and resumed there):

    journal.jsonl        one JSON record per line, each with `schema_version` and `kind`
    tasks/<name>.py      the reference programs, copied in when the run starts
    prompts/<sha>.json   rendered message lists      (content-addressed: sha256 of the text)
    replies/<sha>.md     reply texts
    candidates/<sha>.py  candidate sources (sha256 of the normalised source)
    logs/<sha>.txt       evaluator log tails
    best/<task>.py       the best correct ModelNew of each task (written at the end of a session:
                         report.write_outputs)
    report.md            the run report (idem)
    exchange/            request and reply files of the `exchange` provider, when used

Record kinds: `run` (first line: settings and tasks), `session` (each start or resume), `reply`
(a model call returned: written before its candidate is evaluated, so a kill never repeats a paid
call; a `directions` call of a beam search has a reply and no step), `evaluate` (an evaluation
started), `evaluate_retry` (it was sent again: the process or cluster node running it died, or its
verdict was not one on the candidate; records.EvaluateRetry), `step` (a `records.Step`: call,
candidate or bad reply, verdict, and its place in the search tree: parent candidate, direction,
idea), `profile` (profiler text of a kernel), `task_end` (why a task stopped), `library_examples`
(the kernel library's examples a task's prompts show, chosen when it first starts:
library.examples_for_task), `exit` (a session ended, with its status). Side-by-side steps are
appended as their evaluations finish; their indices keep the order they were asked in.

Each line is flushed and fsynced before the program goes on. A kill loses at most the record being
written: a torn last line is cut off when the journal is opened again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from cutegen import __version__
from cutegen.errors import ConfigError
from cutegen.records import Step, Task, Verdict, from_json, to_json
from cutegen.tasks import source_sha256

SCHEMA_VERSION = 1
JOURNAL = "journal.jsonl"

# EvalConfig fields that describe the machine, not the judgement: left out of evaluation cache keys
# so that a run directory moved to another machine still finds its finished evaluations. busy_retries
# is how long this machine waits out other processes on a shared GPU: it decides whether a verdict
# comes at all (gpu_busy is no verdict on the candidate), never what it says.
MACHINE_LOCAL_EVAL_FIELDS = ("cache_dir", "runtime", "gpus", "log_tail_bytes", "busy_retries", "confinement")


def eval_fingerprint(config: Any) -> dict:
    """The judgement-relevant fields of an EvalConfig."""
    return {k: v for k, v in to_json(config).items() if k not in MACHINE_LOCAL_EVAL_FIELDS}


def eval_key(candidate_sha256: str, task_sha256: str, config: Any) -> str:
    """The evaluation cache key: sha256 of (candidate, task, evaluation settings)."""
    blob = json.dumps([candidate_sha256, task_sha256, eval_fingerprint(config)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class Journal:
    """Append records, store content-addressed files, and answer the resume caches."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / JOURNAL
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._live = False  # this process began a session (wall time counts up to now)
        self._load()

    @classmethod
    def create(cls, run_dir: Path) -> Journal:
        run_dir = Path(run_dir)
        if (run_dir / JOURNAL).exists():
            raise ConfigError(f"Run directory {run_dir} already holds a journal.",
                              "Resume it with `cutegen resume RUN`, or pick another run id.")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / JOURNAL).touch()
        return cls(run_dir)

    @classmethod
    def open(cls, run_dir: Path) -> Journal:
        if not (Path(run_dir) / JOURNAL).is_file():
            raise ConfigError(f"{run_dir} is not a cutegen run directory (no {JOURNAL}).",
                              "Pass the folder `cutegen optimize` printed, e.g. runs/20250101-120000-ab12cd.")
        return cls(run_dir)

    def _load(self) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            # A torn last record (killed mid-write): drop it so the next append starts a clean line.
            keep = raw.rfind(b"\n") + 1
            with open(self.path, "r+b") as handle:
                handle.truncate(keep)
            raw = raw[:keep]
        for number, line in enumerate(raw.decode("utf-8").splitlines(), 1):
            record = json.loads(line)
            if record.get("schema_version", 0) > SCHEMA_VERSION:
                raise ConfigError(f"{self.path} line {number} has schema version {record['schema_version']},"
                                  f" newer than this cutegen understands ({SCHEMA_VERSION}).",
                                  "Upgrade cutegen to resume this run.")
            self.records.append(record)

    # ------------------------------------------------------------------------------------ writing

    def append(self, kind: str, **fields: Any) -> dict:
        record = {"schema_version": SCHEMA_VERSION, "kind": kind, "time": round(time.time(), 3), **to_json(fields)}
        line = json.dumps(record, ensure_ascii=False, sort_keys=False)
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            self.records.append(record)
        return record

    def put_text(self, folder: str, text: str, suffix: str, sha256: str | None = None) -> str:
        """Store `text` as `<folder>/<sha>.<suffix>` (written once, atomically); the relative path."""
        sha = sha256 or hashlib.sha256(text.encode()).hexdigest()
        rel = f"{folder}/{sha}{suffix}"
        path = self.run_dir / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        return rel

    def read_text(self, rel: str) -> str:
        return (self.run_dir / rel).read_text(encoding="utf-8")

    # ------------------------------------------------------------------------------------ reading

    def of_kind(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["kind"] == kind]

    def run_record(self) -> dict:
        runs = self.of_kind("run")
        if not runs:
            raise ConfigError(f"{self.path} has no run record.", "The run never started; start a new one.")
        return runs[0]

    def reply(self, request_sha256: str) -> dict | None:
        return next((r for r in self.of_kind("reply") if r["request_sha256"] == request_sha256), None)

    def verdict(self, key: str) -> Verdict | None:
        for record in self.of_kind("step"):
            if record.get("eval_key") == key and record.get("verdict") is not None:
                return from_json(Verdict, record["verdict"])
        return None

    def profile(self, key: str) -> dict | None:
        return next((r for r in self.of_kind("profile") if r["eval_key"] == key), None)

    def has_step(self, task_id: str, index: int) -> bool:
        return any(r["task_id"] == task_id and r["index"] == index for r in self.of_kind("step"))

    def steps(self, task_id: str | None = None) -> list[Step]:
        """Steps in journal order; a task's in index order (side-by-side steps are recorded as their
        evaluations finish, not in the order they were asked)."""
        steps = [from_json(Step, r) for r in self.of_kind("step") if task_id is None or r["task_id"] == task_id]
        return sorted(steps, key=lambda step: step.index) if task_id is not None else steps

    def task_end(self, task_id: str) -> dict | None:
        """The latest `task_end` of a task (a resumed run with new settings may end it again)."""
        return next((r for r in reversed(self.of_kind("task_end")) if r["task_id"] == task_id), None)

    def replies(self, task_id: str | None = None) -> list[dict]:
        return [r for r in self.of_kind("reply") if task_id is None or r["task_id"] == task_id]

    def totals(self, task_id: str | None = None) -> dict[str, float]:
        """What the run (or one task) has spent so far, from the records."""
        replies = [r["reply"] for r in self.replies(task_id) if r.get("reply")]
        # Once per evaluation: a step that repeats a judged candidate reuses its verdict, spending nothing.
        judged = {s.eval_key: s.verdict.gpu_s or 0.0 for s in self.steps(task_id) if s.verdict is not None}
        gpu = sum(judged.values())
        gpu += sum(r.get("gpu_s") or 0.0 for r in self.of_kind("profile") if task_id in (None, r["task_id"]))
        return {
            "llm_calls": len(self.replies(task_id)),
            "input_tokens": sum(r.get("input_tokens") or 0 for r in replies),
            "output_tokens": sum(r.get("output_tokens") or 0 for r in replies),
            "cost_usd": sum(r.get("cost_usd") or 0.0 for r in replies),
            "gpu_s": gpu,
            "wall_s": self.wall_s(),
        }

    def wall_s(self) -> float:
        """Seconds the run has been running, summed over its sessions (a killed session counts up to
        its last record; the live one up to now)."""
        total, start, last = 0.0, None, None
        for record in self.records:
            if record["kind"] == "session":
                total += (last - start) if start is not None else 0.0
                start = record["time"]
            last = record["time"]
        if start is not None:
            total += (time.time() if self._live else last) - start
        return total

    def begin_session(self, **fields: Any) -> None:
        """Mark the start of a session (a start or a resume) of this process."""
        self.append("session", pid=os.getpid(), **fields)
        self._live = True


# ------------------------------------------------------------------------------------- run setup


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What a run was started with, as read back from its `run` record."""

    run_id: str
    model: str  # provider spec; relative paths in it are relative to the run directory
    agent: dict  # AgentConfig as JSON
    evaluation: dict  # the judgement-relevant EvalConfig fields
    tasks: tuple  # Task records, their paths inside the run directory


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def task_file_name(task_id: str) -> str:
    """A file name for a task id ("level1/19" -> "level1_19")."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)


def start_run(journal: Journal, tasks: list, model: str, agent_config: Any, eval_config: Any) -> None:
    """Copy the tasks into the run directory and write the `run` record (the first line)."""

    entries = []
    for task in tasks:
        rel = f"tasks/{task_file_name(task.task_id)}.py"
        (journal.run_dir / "tasks").mkdir(exist_ok=True)
        (journal.run_dir / rel).write_text(task.source, encoding="utf-8")
        entries.append({"task_id": task.task_id, "name": task.name, "path": rel,
                        "source_sha256": task.source_sha256, "level": task.level, "problem_id": task.problem_id})
    journal.append("run", run_id=journal.run_dir.name, cutegen_version=__version__, model=model,
                   agent=agent_config, evaluation=eval_fingerprint(eval_config), tasks=entries)


def load_run(journal: Journal) -> RunSetup:
    """The run's settings and its tasks (read from the copies inside the run directory)."""

    record = journal.run_record()
    tasks = []
    for entry in record["tasks"]:
        path = journal.run_dir / entry["path"]
        source = path.read_text(encoding="utf-8")
        if source_sha256(source) != entry["source_sha256"]:
            raise ConfigError(f"Task file {path} was changed after the run started.",
                              "Restore it (its hash is in the first line of journal.jsonl) or start a new run.")
        tasks.append(Task(task_id=entry["task_id"], name=entry["name"], path=path, source=source,
                          source_sha256=entry["source_sha256"], level=entry["level"], problem_id=entry["problem_id"]))
    return RunSetup(run_id=record["run_id"], model=record["model"], agent=record["agent"],
                    evaluation=record["evaluation"], tasks=tuple(tasks))
