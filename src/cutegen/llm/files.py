"""Providers that answer from files: `exchange` (a person or another program replies) and `replay`.

exchange:DIR
    Each request is written as `DIR/<id>.request.md` (readable) and `DIR/<id>.request.json` (the
    whole message list), `<id>` being the request's sha256. The answer is expected in
    `DIR/<id>.reply.md` (or `.reply.txt`): the model's reply as plain text, code fence included.
    While it is missing, `complete` raises `ReplyPending`; the agent saves and exits with status 75
    once every unfinished task waits, and `cutegen resume RUN` picks the replies up.

replay:FILE
    RECORDED replies, never a live model: a JSON-lines file, one reply per line,
    `{"task": TASK_ID, "stage": STAGE, "text": REPLY, "model": WHO_WROTE_IT}` (stage and model
    optional; a line may instead carry `request_sha256` to answer one exact request; lines with
    only an `about` key describe the file). The n-th call of a task gets the n-th line for that task,
    so a replayed run is deterministic and independent of how tasks interleave. Every reply it gives
    is marked `recorded=True` and costs nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from cutegen.errors import ConfigError
from cutegen.llm.base import ProviderError, ReplyPending, request_sha256
from cutegen.records import Reply, Request, to_json

REPLY_SUFFIXES = (".reply.md", ".reply.txt")


class ExchangeProvider:
    """Requests and replies as files in a folder (air-gapped machines, batch APIs, a person)."""

    provider = "exchange"
    model_id = "exchange"

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    async def complete(self, request: Request) -> Reply:
        rid = request_sha256(request, self.model_id)
        for suffix in REPLY_SUFFIXES:
            path = self.folder / f"{rid}{suffix}"
            if path.is_file():
                return Reply(
                    text=path.read_text(encoding="utf-8"), provider="exchange", model="exchange",
                    request_sha256=rid, input_tokens=None, output_tokens=None, cost_usd=None,
                    latency_s=None, truncated=False,
                )
        self._write_request(rid, request)
        raise ReplyPending(rid, self.folder / f"{rid}.reply.md")

    def pending(self) -> list[Path]:
        """Request files that have no reply file yet."""
        found = []
        for path in sorted(self.folder.glob("*.request.json")):
            rid = path.name.removesuffix(".request.json")
            if not any((self.folder / f"{rid}{s}").is_file() for s in REPLY_SUFFIXES):
                found.append(path)
        return found

    def _write_request(self, rid: str, request: Request) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        body = {"request_sha256": rid, "reply_file": f"{rid}.reply.md", **to_json(request)}
        _write_atomic(self.folder / f"{rid}.request.json", json.dumps(body, indent=1, ensure_ascii=False))
        parts = [
            f"# Request {rid}\n",
            f"Task `{request.task_id}`, stage `{request.stage}`, call {request.seq}, at most"
            f" {request.max_tokens} tokens.\n",
            f"Write the model's whole reply to `{rid}.reply.md` in this folder, then run"
            " `cutegen resume RUN`.\n",
        ]
        for message in request.messages:
            parts.append(f"\n## {message.role}\n\n{message.content}\n")
        _write_atomic(self.folder / f"{rid}.request.md", "".join(parts))


class ReplayProvider:
    """Recorded replies from a JSON-lines file, labelled as recorded in every Reply."""

    provider = "replay"
    model_id = "replay"

    def __init__(self, path: Path, *, delay_s: float = 0.0, log_path: Path | None = None) -> None:
        self.path = Path(path)
        self.delay_s = delay_s
        self.log_path = log_path
        self.by_task: dict[str, list[dict]] = {}
        self.by_hash: dict[str, dict] = {}
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise ConfigError(
                f"Replay file {self.path} cannot be read ({err.strerror}).",
                "Give the path of a JSON-lines file of recorded replies (see examples/replays/).",
            ) from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as err:
                raise ConfigError(f"Replay file {self.path}, line {number}: not JSON ({err}).",
                                  "Write one JSON object per line.") from None
            if "text" not in entry:
                if set(entry) <= {"about"}:
                    continue
                raise ConfigError(f"Replay file {self.path}, line {number}: no 'text' field.",
                                  'Each reply line needs "task" and "text" (or "request_sha256" and "text").')
            if "request_sha256" in entry:
                self.by_hash[entry["request_sha256"]] = entry
            else:
                self.by_task.setdefault(str(entry.get("task", "")), []).append(entry)

    async def complete(self, request: Request) -> Reply:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        rid = request_sha256(request, self.model_id)
        entry = self.by_hash.get(rid) or self._in_order(request)
        self._log(rid, request)
        return Reply(
            text=entry["text"], provider="replay", model=str(entry.get("model", "recorded")),
            request_sha256=rid, input_tokens=entry.get("input_tokens"),
            output_tokens=entry.get("output_tokens"), cost_usd=0.0, latency_s=None,
            truncated=bool(entry.get("truncated", False)), recorded=True,
        )

    def _in_order(self, request: Request) -> dict:
        entries = self.by_task.get(request.task_id, [])
        if request.seq >= len(entries):
            raise ProviderError(
                f"Replay file {self.path.name} holds {len(entries)} replies for task {request.task_id!r};"
                f" the run asked for reply {request.seq + 1} (stage {request.stage}).",
                "Record more replies for this task, or lower --rounds/--repairs so the run asks for fewer.",
            )
        entry = entries[request.seq]
        if entry.get("stage") and entry["stage"] != request.stage:
            raise ProviderError(
                f"Replay file {self.path.name}: reply {request.seq + 1} of task {request.task_id!r} was"
                f" recorded for stage {entry['stage']!r} but the run is at stage {request.stage!r}.",
                "The run took another path than the recording (different settings or evaluator verdicts);"
                " re-record the replies or use the settings they were recorded with.",
            )
        return entry

    def _log(self, rid: str, request: Request) -> None:
        # One line per reply served: lets a test (or a person) count the calls a run really made.
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"request_sha256": rid, "task": request.task_id, "seq": request.seq,
                           "stage": request.stage})
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(line + "\n")
            log.flush()
            os.fsync(log.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
