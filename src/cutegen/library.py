"""The kernel library: every accepted kernel kept in one SQLite file, and found again by similar tasks.

What goes in: each kernel that passed the evaluator in `cutegen eval`, `cutegen optimize` or
`cutegen bench` (the agent's steps, or `--evaluate`), or that a finished run directory holds
(`import_run`), with its task's signature (records.TaskSignature: traced op sequence and class,
shapes, dtypes, parameters), its source, backend, architecture and precision track, what was measured
(records.KernelMeasurement) and where it came from (records.Provenance). Never a kernel that did not
pass: `entry_from_verdict` refuses one. One kernel judged on one task under one backend, architecture
and track is one entry: adding it again changes nothing (the content hash is the candidate's sha256).

What comes out (`KernelLibrary.neighbours`, `examples`): the verified kernels of other tasks nearest
to a task's signature, one per task (its fastest), ranked by `Distance`: the same op class first, then
the same dtypes, anchor op and aten ops, then the nearest sizes. Only kernels of the backend family
the prompt asks for (own CUDA kernels: cute and cuda; or torch), verified under a track at least as
strict, and timed (each is shown with its measured speed); one measured on another architecture
comes with a note; the task's own entries only when asked (`same_task`). A run journals the examples each task was shown
(`examples_for_task`), so a resumed run asks exactly the requests it recorded.

The file: SQLite in WAL mode (readers never wait for a writer); a writer takes the lock when its
transaction begins (BEGIN IMMEDIATE: two writers that both upgrade a read lock would fail one at once,
whatever the timeout), waits up to `busy_timeout_s` for it, and the whole transaction is tried again
with backoff `retries` times after that, so several processes (lanes, Ray's driver and a bench run
beside it, two users' jobs) can write at once and none loses an entry. The schema is versioned: each
migration is a list of statements applied once, in order, in the transaction that records it in
`schema_version`; migrations are only ever appended. A file that is not an SQLite database, or was
written by a newer cutegen, is refused with the file's name and what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import math
import random
import re
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from cutegen import __version__, bench, export
from cutegen.config import OWN_KERNEL_BACKENDS, LibraryConfig
from cutegen.errors import ConfigError
from cutegen.journal import JOURNAL, Journal, load_run
from cutegen.records import (
    BenchRun, BenchTaskResult, KernelMeasurement, LibraryEntry, LibraryExample, Provenance, Task, TaskSignature,
    TaskTrace, Verdict, from_json, to_json,
)
from cutegen.tasks import load_tasks, normalize_source, source_sha256, task_module
from cutegen.trace import quiet_stdout, trace_task

# Append-only: a released migration is never edited, a change of schema is a new one at the end.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the kernels and the version table.
    ("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_utc TEXT NOT NULL)",
     """CREATE TABLE kernels (
            id INTEGER PRIMARY KEY,
            content_sha256 TEXT NOT NULL, task_id TEXT NOT NULL, task_name TEXT NOT NULL,
            task_sha256 TEXT NOT NULL, op_class TEXT NOT NULL, signature TEXT NOT NULL, source TEXT NOT NULL,
            backend TEXT NOT NULL, track TEXT NOT NULL, arch TEXT NOT NULL,
            median_ms REAL, eager_median_ms REAL, compile_median_ms REAL, speedup_vs_eager REAL,
            speedup_vs_compile REAL, sol_fraction REAL, sol_bound_ms REAL, feedback TEXT NOT NULL,
            verdict TEXT, origin TEXT NOT NULL, model TEXT, run_id TEXT, added_utc TEXT NOT NULL,
            cutegen_version TEXT NOT NULL,
            UNIQUE (content_sha256, task_sha256, backend, arch, track))"""),
    # 2: the device's name beside its architecture (an H100 and an H200 are both sm_90); searches by class.
    ("ALTER TABLE kernels ADD COLUMN device_name TEXT",
     "CREATE INDEX kernels_by_class ON kernels (op_class, backend, track)"),
)
SCHEMA_VERSION = len(MIGRATIONS)
_MEASURED = ("median_ms", "eager_median_ms", "compile_median_ms", "speedup_vs_eager", "speedup_vs_compile",
             "sol_fraction", "sol_bound_ms", "feedback")
_PROVENANCE = ("origin", "model", "run_id", "added_utc", "cutegen_version")


# ------------------------------------------------------------------------------ signatures and entries


def task_signature(task: Task, trace: TaskTrace | None = None) -> TaskSignature:
    """The task's signature: its trace (`trace` when the caller has it) and its shapes, dtypes and
    non-tensor arguments, found by building it on the meta device (none when that fails)."""

    trace = trace or trace_task(task)
    return TaskSignature(op_class=trace.workload_class, aten_ops=tuple(trace.aten_ops), anchor_op=trace.anchor_op,
                         flops=trace.flops, min_bytes=trace.min_bytes, **_meta_shapes(task))


def _meta_shapes(task: Task) -> dict[str, tuple]:
    import torch  # lazy: loading torch takes seconds

    try:
        module = task_module(task)
        with quiet_stdout(), warnings.catch_warnings(), torch.device("meta"), torch.no_grad():
            warnings.simplefilter("ignore")
            init, inputs = list(module.get_init_inputs()), list(module.get_inputs())
            outputs = module.Model(*init)(*inputs)
    except Exception:  # data-dependent code, ops without a meta kernel: compared by trace alone
        return dict(input_shapes=(), input_dtypes=(), output_shapes=(), output_dtypes=(), params=())
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    outs = [t for t in (outputs if isinstance(outputs, (list, tuple)) else [outputs]) if isinstance(t, torch.Tensor)]

    def dtypes(ts: list) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(t.dtype).removeprefix("torch.") for t in ts))

    return dict(input_shapes=tuple(tuple(int(d) for d in t.shape) for t in tensors), input_dtypes=dtypes(tensors),
                output_shapes=tuple(tuple(int(d) for d in t.shape) for t in outs), output_dtypes=dtypes(outs),
                params=tuple(repr(v)[:80] for v in init + inputs if not isinstance(v, torch.Tensor)))


def arch_name(value: str | None) -> str | None:
    """"sm_90a", "sm_90", "9.0" or "90" -> "sm_90" (the hardware: sm_90a is sm_90 with its own
    instructions enabled); "cpu" and "unknown" unchanged; None for nothing."""
    if not value:
        return None
    text = value.strip().lower()
    if text in ("cpu", "unknown"):
        return text
    digits = "".join(c for c in text.removeprefix("sm_").removeprefix("compute_") if c.isdigit())
    return f"sm_{digits}" if digits else text


def measurement_of(verdict: Verdict) -> KernelMeasurement:
    return KernelMeasurement(
        median_ms=verdict.timing.median_ms if verdict.timing else None,
        eager_median_ms=verdict.eager.median_ms if verdict.eager else None,
        compile_median_ms=verdict.compiled.median_ms if verdict.compiled else None,
        speedup_vs_eager=verdict.speedup_vs_eager, speedup_vs_compile=verdict.speedup_vs_compile,
        sol_fraction=verdict.sol_fraction, sol_bound_ms=verdict.sol_bound_ms, feedback=verdict.feedback)


def provenance(origin: str, model: str | None = None, run_id: str | None = None) -> Provenance:
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return Provenance(origin=origin, model=model, run_id=run_id, added_utc=now, cutegen_version=__version__)


def new_entry(task: Task, signature: TaskSignature, source: str, *, backend: str, track: str, arch: str | None,
              device_name: str | None, measured: KernelMeasurement, where: Provenance,
              verdict: Verdict | None = None) -> LibraryEntry:
    """An entry for a kernel the evaluator accepted; the source is stored normalised, under its hash."""

    return LibraryEntry(content_sha256=source_sha256(source), task_id=task.task_id, task_name=task.name,
                        task_sha256=task.source_sha256, signature=signature, source=normalize_source(source),
                        backend=backend, track=track, arch=arch_name(arch) or "unknown", device_name=device_name,
                        measured=measured, provenance=where, verdict=verdict)


def entry_from_verdict(task: Task, signature: TaskSignature, source: str, verdict: Verdict, where: Provenance, *,
                       arch: str | None, device_name: str | None = None) -> LibraryEntry:
    """The entry of a passing verdict on `source`. A verdict that did not pass, or that judged another
    source, is refused: the library holds only kernels the evaluator accepted (the examples a model is
    shown are verified ones)."""

    if not verdict.passed:
        raise ValueError(f"verdict on {verdict.candidate_sha256[:12]} did not pass ({verdict.failure}):"
                         " the library keeps accepted kernels only")
    if source_sha256(source) != verdict.candidate_sha256:  # e.g. the file was edited while it was judged
        raise ValueError(f"the source given (sha256 {source_sha256(source)[:12]}) is not the one the verdict"
                         f" judged ({verdict.candidate_sha256[:12]})")
    kept = dataclasses.replace(verdict, log_tail="")  # the log is for the run's reader, not the library
    return new_entry(task, signature, source, backend=verdict.backend, track=verdict.track, arch=arch,
                     device_name=device_name, measured=measurement_of(verdict), where=where, verdict=kept)


# ------------------------------------------------------------------------------ similarity


@dataclass(frozen=True, order=True)
class Distance:
    """How far an entry's task is from a query task, compared field by field in this order: the op
    class decides first; then the dtypes (a bf16 tensor-core GEMM teaches little to an fp32 one); then
    the anchor op (the one with the most FLOPs, else the first: a convolution followed by a ReLU is
    closer to a convolution than to a ReLU); then the aten ops the two do not share; then sizes (log2
    of elements in and out, one per factor of two, plus one per differing rank or input count). The
    architecture only breaks ties."""

    other_class: int  # 0: the same op class
    dtype_distance: float  # 1 - Jaccard overlap of the input and output dtypes
    other_anchor: int  # 0: the same anchor op
    op_distance: float  # 1 - Jaccard overlap of the aten ops
    shape_distance: float
    other_arch: int  # 0: measured on the query's architecture


def _jaccard_distance(a: tuple, b: tuple) -> float:
    union = set(a) | set(b)
    return round(1.0 - len(set(a) & set(b)) / len(union), 4) if union else 0.0


def _shape_distance(a: TaskSignature, b: TaskSignature) -> float:
    def size(shapes: tuple) -> float:
        return math.log2(1 + sum(math.prod(s) for s in shapes))

    def rank(shapes: tuple) -> int:
        return len(shapes[0]) if shapes else 0

    return round(abs(size(a.input_shapes) - size(b.input_shapes)) + abs(size(a.output_shapes) - size(b.output_shapes))
                 + abs(rank(a.input_shapes) - rank(b.input_shapes)) + abs(len(a.input_shapes) - len(b.input_shapes)), 3)


def distance(query: TaskSignature, other: TaskSignature, arch: str | None = None, other_arch: str | None = None) -> Distance:
    return Distance(other_class=int(query.op_class != other.op_class),
                    dtype_distance=_jaccard_distance(query.input_dtypes + query.output_dtypes,
                                                     other.input_dtypes + other.output_dtypes),
                    other_anchor=int(query.anchor_op is None or query.anchor_op != other.anchor_op),
                    op_distance=_jaccard_distance(query.aten_ops, other.aten_ops),
                    shape_distance=_shape_distance(query, other), other_arch=int(arch is None or arch != other_arch))


def _backend_family(backend: str) -> tuple[str, ...]:
    return tuple(sorted(OWN_KERNEL_BACKENDS)) if backend in OWN_KERNEL_BACKENDS else (backend,)


def _tracks_for(track: str) -> tuple[str, ...]:
    """Tracks whose verification covers `track`: an fp32 kernel passes a tf32 task's looser tolerance."""
    return ("fp32",) if track == "fp32" else ("fp32", track)


# ------------------------------------------------------------------------------ the store


class KernelLibrary:
    """One library file: `add` entries, read them back (`entries`, `get`), find a task's neighbours
    (`neighbours`, `examples`), `prune`. Each call opens its own connection, so one object serves any
    thread, and forked or spawned processes open their own."""

    def __init__(self, config: LibraryConfig) -> None:
        self.config = config
        self.path = Path(config.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"Kernel library folder {self.path.parent} cannot be made ({err.strerror}).",
                              "Give a writable file with --library PATH, or --no-library.") from None
        self._run(lambda conn: conn.execute("PRAGMA journal_mode=WAL").fetchone(), begin=None)
        self._run(self._migrate)

    # ------------------------------------------------------------------------ connections

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=self.config.busy_timeout_s, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            yield conn
        finally:
            conn.close()

    def _run(self, work: Callable[[sqlite3.Connection], Any], begin: str | None = "BEGIN IMMEDIATE") -> Any:
        """`work(conn)` in one transaction (`begin`: "BEGIN IMMEDIATE" for writers, "BEGIN" for readers,
        None for none), the whole of it tried again with backoff while other writers hold the lock."""
        for attempt in range(self.config.retries + 1):
            try:
                with self._connection() as conn:
                    if begin:
                        conn.execute(begin)
                    try:
                        result = work(conn)
                        if conn.in_transaction:
                            conn.execute("COMMIT")
                        return result
                    finally:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) and "busy" not in str(err):
                    raise self._broken(err) from None
                if attempt == self.config.retries:
                    raise ConfigError(f"Kernel library {self.path} stayed locked by other writers through"
                                      f" {self.config.retries} retries ({err}).",
                                      "Run again when the other cutegen processes have finished, or give"
                                      " another file with --library PATH.") from None
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
            except sqlite3.DatabaseError as err:
                raise self._broken(err) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _broken(self, err: Exception) -> ConfigError:
        return ConfigError(f"Kernel library {self.path} cannot be read as an SQLite database ({err}).",
                           f"Move it aside (mv {self.path} {self.path}.broken) and cutegen starts a new, empty"
                           " library there; or give another file with --library PATH, or run with --no-library.")

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the file to SCHEMA_VERSION inside the caller's write transaction (so two processes
        opening a new file at once apply each migration once)."""
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_version" not in tables and tables:
            raise ConfigError(f"{self.path} is an SQLite file but not a cutegen kernel library (its tables:"
                              f" {', '.join(sorted(tables))}).", "Give the library's own file with --library PATH.")
        version = (conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0) if tables else 0
        if version > SCHEMA_VERSION:
            raise ConfigError(f"Kernel library {self.path} has schema version {version}, newer than this cutegen"
                              f" understands ({SCHEMA_VERSION}): a newer cutegen wrote it.",
                              "Upgrade cutegen (pip install -U cutegen) to use it, or give another file with"
                              " --library PATH.")
        for number in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[number - 1]:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version, applied_utc) VALUES (?, ?)",
                         (number, _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")))

    # ------------------------------------------------------------------------ writing

    def add(self, entry: LibraryEntry) -> int | None:
        """Store `entry`; its row id, or None when the same kernel, task, backend, arch and track is there."""
        return self.add_many([entry])[0]

    def add_many(self, entries: list[LibraryEntry]) -> list[int | None]:
        """Store entries in one transaction; per entry its row id, or None when it was there already."""
        rows = [_row(entry) for entry in entries]

        def insert(conn: sqlite3.Connection) -> list[int | None]:
            ids = []
            for row in rows:
                cursor = conn.execute(f"INSERT OR IGNORE INTO kernels ({', '.join(row)}) VALUES"
                                      f" ({', '.join('?' * len(row))})", list(row.values()))
                ids.append(cursor.lastrowid if cursor.rowcount else None)
            return ids

        return self._run(insert) if rows else []

    def add_verdict(self, task: Task, signature: TaskSignature, source: str, verdict: Verdict,
                    where: Provenance) -> int | None:
        """A passing verdict of this machine (the config's arch and device) as an entry."""
        return self.add(entry_from_verdict(task, signature, source, verdict, where, arch=self.config.arch,
                                           device_name=self.config.device_name))

    def prune(self, *, keep: int | None = None, before: str | None = None, task: str | None = None,
              dry_run: bool = False) -> list[LibraryEntry]:
        """Remove entries (of `task` only, when given): all but the `keep` fastest of each task, backend,
        arch and track, and those added before the ISO date `before`. The removed entries."""
        if keep is None and before is None:
            raise ConfigError("Prune was given nothing to remove.", "Pass --keep N (the fastest N of each task"
                              " stay), --before DATE (entries added earlier go), or both.")
        groups: dict[tuple, list[LibraryEntry]] = {}
        for entry in self.entries(task=task):
            groups.setdefault((entry.task_sha256, entry.backend, entry.arch, entry.track), []).append(entry)
        doomed = []
        for group in groups.values():
            ranked = sorted(group, key=lambda e: (e.measured.median_ms is None, e.measured.median_ms or 0.0, e.entry_id))
            doomed += [e for i, e in enumerate(ranked) if (keep is not None and i >= keep)
                       or (before is not None and e.provenance.added_utc < before)]
        if doomed and not dry_run:
            ids = [e.entry_id for e in doomed]
            self._run(lambda conn: conn.execute(f"DELETE FROM kernels WHERE id IN ({', '.join('?' * len(ids))})", ids))
        return sorted(doomed, key=lambda e: e.entry_id or 0)

    # ------------------------------------------------------------------------ reading

    def entries(self, *, op_class: str | None = None, task: str | None = None, backend: str | None = None,
                arch: str | None = None, limit: int | None = None) -> list[LibraryEntry]:
        """Entries in the order they were added; `task` matches a task id or file stem."""
        clauses, args = [], []
        for column, value in (("op_class", op_class), ("backend", backend), ("arch", arch_name(arch))):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if task is not None:
            clauses.append("(task_id = ? OR task_name = ?)")
            args += [task, task]
        sql = "SELECT * FROM kernels" + (" WHERE " + " AND ".join(clauses) if clauses else "") + " ORDER BY id"
        sql += f" LIMIT {int(limit)}" if limit else ""
        return self._run(lambda conn: [_entry(row) for row in conn.execute(sql, args)], begin="BEGIN")

    def get(self, key: str) -> LibraryEntry:
        """One entry by row id, or by a prefix of its content hash that names one entry."""
        rows = self._run(lambda conn: conn.execute("SELECT * FROM kernels WHERE id = ? OR content_sha256 LIKE ?",
                                                   (int(key) if key.isdigit() else -1, f"{key.lower()}%")
                                                   ).fetchall(), begin="BEGIN")
        if len(rows) != 1:
            what = "no entry" if not rows else f"{len(rows)} entries (ids {', '.join(str(r['id']) for r in rows)})"
            raise ConfigError(f"Kernel library {self.path} has {what} for {key!r}.",
                              "Name an entry by the id `cutegen library list` shows, or by more of its hash.")
        return _entry(rows[0])

    def neighbours(self, signature: TaskSignature, *, backend: str, track: str, task: Task | None = None,
                   same_task: bool = False, k: int | None = None) -> list[tuple[LibraryEntry, Distance]]:
        """The timed entries nearest `signature` of the backend family and tracks that serve (`backend`,
        `track`), one per task (its fastest), nearest first; `task`'s own (same source hash or task id)
        left out unless `same_task`."""
        families, tracks = _backend_family(backend), _tracks_for(track)
        sql = (f"SELECT * FROM kernels WHERE median_ms IS NOT NULL AND backend IN ({', '.join('?' * len(families))})"
               f" AND track IN ({', '.join('?' * len(tracks))})")
        rows = self._run(lambda conn: [_entry(r) for r in conn.execute(sql, families + tracks)], begin="BEGIN")
        if task is not None and not same_task:
            rows = [e for e in rows if e.task_sha256 != task.source_sha256 and e.task_id != task.task_id]
        arch = arch_name(self.config.arch)
        ranked = sorted(((e, distance(signature, e.signature, arch, e.arch)) for e in fastest_per_task(rows)),
                        key=lambda pair: (pair[1], -(pair[0].measured.speedup_vs_eager or 0.0), pair[0].entry_id))
        return ranked[:k] if k is not None else ranked

    def examples(self, task: Task, signature: TaskSignature, *, backend: str, track: str, k: int,
                 same_task: bool = False) -> tuple[LibraryExample, ...]:
        """Up to `k` neighbours as a prompt shows them (kernels longer than max_example_chars skipped)."""
        fitting = [e for e, _ in self.neighbours(signature, backend=backend, track=track, task=task,
                                                 same_task=same_task) if len(e.source) <= self.config.max_example_chars]
        return tuple(_example(e, arch_name(self.config.arch)) for e in fitting[:k])


def fastest_per_task(entries: list[LibraryEntry]) -> list[LibraryEntry]:
    """One entry per task (by source hash), the one a prompt should show: the largest speedup over
    eager, else the smallest median; in the order the tasks first appear."""
    best: dict[str, LibraryEntry] = {}
    for entry in entries:
        held = best.get(entry.task_sha256)
        if held is None or _faster(entry, held):
            best[entry.task_sha256] = entry
    return list(best.values())


def _faster(a: LibraryEntry, b: LibraryEntry) -> bool:
    sa, sb = a.measured.speedup_vs_eager, b.measured.speedup_vs_eager
    if sa is not None and sb is not None and sa != sb:
        return sa > sb
    return (a.measured.median_ms or math.inf) < (b.measured.median_ms or math.inf)


def _row(entry: LibraryEntry) -> dict[str, Any]:
    return {"content_sha256": entry.content_sha256, "task_id": entry.task_id, "task_name": entry.task_name,
            "task_sha256": entry.task_sha256, "op_class": entry.signature.op_class,
            "signature": json.dumps(to_json(entry.signature)), "source": entry.source, "backend": entry.backend,
            "track": entry.track, "arch": entry.arch, "device_name": entry.device_name,
            **{name: getattr(entry.measured, name) for name in _MEASURED},
            "verdict": json.dumps(to_json(entry.verdict)) if entry.verdict is not None else None,
            **{name: getattr(entry.provenance, name) for name in _PROVENANCE}}


def _entry(row: sqlite3.Row) -> LibraryEntry:
    return LibraryEntry(
        content_sha256=row["content_sha256"], task_id=row["task_id"], task_name=row["task_name"],
        task_sha256=row["task_sha256"], signature=from_json(TaskSignature, json.loads(row["signature"])),
        source=row["source"], backend=row["backend"], track=row["track"], arch=row["arch"],
        device_name=row["device_name"], measured=KernelMeasurement(**{name: row[name] for name in _MEASURED}),
        provenance=Provenance(**{name: row[name] for name in _PROVENANCE}),
        verdict=from_json(Verdict, json.loads(row["verdict"])) if row["verdict"] else None, entry_id=row["id"])


# ------------------------------------------------------------------------------ examples in prompts


def speed_text(entry: LibraryEntry) -> str:
    """What was measured, in words a model can compare: "median 3.19 ms, 1.35x eager PyTorch, ..."."""
    m = entry.measured
    parts = [f"median {m.median_ms:.4g} ms"] if m.median_ms is not None else ["not timed"]
    if m.speedup_vs_eager is not None:
        parts.append(f"{m.speedup_vs_eager:.3g}x eager PyTorch")
    if m.speedup_vs_compile is not None:
        parts.append(f"{m.speedup_vs_compile:.3g}x torch.compile")
    if m.sol_fraction is not None:
        parts.append(f"{m.sol_fraction:.0%} of the reference algorithm's work bound")
    where = f"{entry.device_name} ({entry.arch})" if entry.device_name else entry.arch
    return ", ".join(parts) + f"; measured on {where}, {entry.track} track, backend {entry.backend}"


def shapes_text(signature: TaskSignature) -> str:
    def side(shapes: tuple, dtypes: tuple) -> str:
        listed = ", ".join("(" + ", ".join(map(str, s)) + ")" for s in shapes) or "?"
        return listed + (" " + "/".join(dtypes) if dtypes else "")

    return (f"inputs {side(signature.input_shapes, signature.input_dtypes)} -> outputs"
            f" {side(signature.output_shapes, signature.output_dtypes)}")


def _example(entry: LibraryEntry, arch: str | None) -> LibraryExample:
    note = None
    if arch is None:
        note = (f"measured on {entry.arch}; the architecture this run targets is not known here, so its speed"
                " there may differ")
    elif entry.arch != arch:
        note = (f"measured on {entry.arch}, not on this run's {arch}: its speed here is not known, and it may"
                f" rely on features {arch} lacks")
    return LibraryExample(entry_id=entry.entry_id or 0, task_id=entry.task_id, op_class=entry.signature.op_class,
                          aten_ops=entry.signature.aten_ops, shapes=shapes_text(entry.signature),
                          backend=entry.backend, source=entry.source, speed=speed_text(entry), note=note)


def examples_for_task(journal: Any, task: Task, signature: TaskSignature | None, library: KernelLibrary | None, *,
                      k: int, same_task: bool, backend: str, track: str) -> tuple[LibraryExample, ...]:
    """The library examples a task's prompts show in this run. Chosen once, when the task first starts,
    and journaled (`library_examples`): a resumed run reads them back, so its prompts, and with them its
    request ids, are the recorded ones whatever entered the library since. A task that began in a run
    written before examples were journaled was shown none, and still is."""

    for record in reversed(journal.of_kind("library_examples")):
        if record["task_id"] == task.task_id:
            return tuple(from_json(LibraryExample, e) for e in record["examples"])
    if library is None or signature is None or k <= 0 or journal.replies(task.task_id):
        return ()
    chosen = library.examples(task, signature, backend=backend, track=track, k=k, same_task=same_task)
    journal.append("library_examples", task_id=task.task_id, examples=list(chosen))
    return chosen


# ------------------------------------------------------------------------------ finished runs


def import_run(library: KernelLibrary, run_dir: Path, *, suite: Path | None = None,
               arch: str | None = None) -> tuple[list[int | None], list[LibraryEntry]]:
    """Every accepted kernel of a finished run directory (an agent run's journal steps, or an --evaluate
    run's verdicts.jsonl) added to the library: (row id or None when already there, per entry; the entries).
    The architecture is `arch`, else the GPU of the run's bench.json, else "cpu" for a CPU run, else unknown."""

    run_dir = Path(run_dir)
    meta = bench.read_meta(run_dir) or {}
    machine = bench.evaluation_machine(meta) if meta else {}
    if (run_dir / JOURNAL).is_file():
        found, where, device = _journal_kernels(run_dir)
    elif (run_dir / bench.VERDICTS).is_file():
        found, where, device = _verdict_log_kernels(run_dir, meta, suite), provenance("import", None, run_dir.name), None
    else:
        raise ConfigError(f"{run_dir} is not a run directory (no {JOURNAL} and no {bench.VERDICTS}).",
                          "Pass a folder that `cutegen optimize` or `cutegen bench` made, e.g. runs/<id>.")
    cpu = device == "cpu" or machine.get("gpu_count") == 0
    arch = arch or arch_name(machine.get("gpu_capability")) or ("cpu" if cpu else None)
    signatures: dict[str, TaskSignature] = {}
    entries = []
    for task, source, verdict in found:
        signature = signatures.get(task.task_id) or signatures.setdefault(task.task_id, task_signature(task))
        entries.append(entry_from_verdict(task, signature, source, verdict, where, arch=arch,
                                          device_name=machine.get("gpu_name")))
    return library.add_many(entries), entries


def _journal_kernels(run_dir: Path) -> tuple[list[tuple[Task, str, Verdict]], Provenance, str | None]:
    """(task, source, verdict) of each passing step, the run's provenance and its evaluation device."""

    journal = Journal.open(run_dir)
    setup = load_run(journal)
    tasks = {t.task_id: t for t in setup.tasks}
    found = [(tasks[s.task_id], journal.read_text(s.candidate_path), s.verdict) for s in journal.steps()
             if s.verdict is not None and s.verdict.passed and s.candidate_path and s.task_id in tasks]
    return found, provenance("import", setup.model, setup.run_id), setup.evaluation.get("device")


def _verdict_log_kernels(run_dir: Path, meta: dict, suite: Path | None) -> list[tuple[Task, str, Verdict]]:
    where = suite or (Path(meta["suite"]) if meta.get("suite") else None)
    if where is None or not where.exists():
        raise ConfigError(f"The tasks of {run_dir} are not beside it and its suite ({where}) is not found from here.",
                          "Pass --suite with the task folder or KernelBench checkout the run judged.")
    tasks = {t.task_id: t for t in load_tasks(where, meta.get("select"))}
    found = []
    for line in (run_dir / bench.VERDICTS).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a torn last line of a killed run: that evaluation was not finished
            continue
        verdict = from_json(Verdict, record["verdict"]) if record.get("verdict") else None
        if verdict is not None and verdict.passed and record["task_id"] in tasks:
            found.append((tasks[record["task_id"]], (run_dir / record["candidate_path"]).read_text(encoding="utf-8"),
                          verdict))
    return found


# ------------------------------------------------------------------------------ export


def export_entry(entry: LibraryEntry, fmt: str) -> tuple[str, str]:
    """(source, default file name) of an entry exported as export.py exports a run's best kernel: a
    KernelBench ModelNew file or a torch custom op, with a header saying what was measured where."""

    if fmt not in export.FORMATS:
        raise ConfigError(f"Export format {fmt!r} is not one of {', '.join(export.FORMATS)}.",
                          "Pass --format kernelbench or --format torch-op.")
    suite = re.fullmatch(r"level(\d+)/(\d+)", entry.task_id)
    m = entry.measured
    result = BenchTaskResult(
        task_id=entry.task_id, name=entry.task_name, level=int(suite.group(1)) if suite else None,
        problem_id=int(suite.group(2)) if suite else None, sample_id=None, compiled=True, correctness=True,
        runtime=None, ref_runtime=None, status="done", stage_reached="passed", failure=None, median_ms=m.median_ms,
        eager_median_ms=m.eager_median_ms, compile_median_ms=m.compile_median_ms, speedup_vs_eager=m.speedup_vs_eager,
        speedup_vs_compile=m.speedup_vs_compile, sol_fraction=m.sol_fraction, needs_review=False, degenerate=(),
        excluded=(), candidate_sha256=entry.content_sha256, candidate_path=None, stop_reason=None, steps=0, rounds=0,
        llm_calls=0, input_tokens=0, output_tokens=0, cost_usd=0.0, gpu_s=0.0)
    origin = entry.provenance.run_id or entry.provenance.origin
    run = BenchRun(run_id=f"{origin}, kernel library entry {entry.entry_id}", kind="library", path=Path("."),
                   model=entry.provenance.model, recorded=False, suite=None, suite_commit=None, tasks_sha256="",
                   agent={}, evaluation={"backend": entry.backend, "track": entry.track}, tolerance={},
                   manifest={"gpu_name": entry.device_name or entry.arch}, results=(result,), summary=())
    if fmt == "kernelbench":
        return export.kernelbench_source(entry.source, result, run), export.kernelbench_file_name(result)
    return export.torch_op_source(entry.source, result, run), f"{entry.task_name}_op.py"
