"""The kernel library (cutegen.library) on CPU: store and retrieve, dedup, what retrieval may show,
schema migration, several processes writing at once, unusable files, examples pinned by the journal,
prune and export."""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from cutegen.config import LibraryConfig
from cutegen.errors import ConfigError
from cutegen.journal import Journal
from cutegen.library import (
    MIGRATIONS,
    SCHEMA_VERSION,
    KernelLibrary,
    arch_name,
    examples_for_task,
    export_entry,
    provenance,
    task_signature,
)
from cutegen.records import CheckResult, Task, TaskSignature, TimingStats, Verdict
from cutegen.tasks import load_task, load_tasks, source_sha256

REPO = Path(__file__).resolve().parents[1]
TASKS = {p.stem: load_task(p) for p in sorted((REPO / "examples" / "tasks").glob("*.py"))}
CANDIDATES = REPO / "examples" / "candidates"


@pytest.fixture(scope="module")
def signatures() -> dict[str, TaskSignature]:
    return {name: task_signature(task) for name, task in TASKS.items()}


def verdict_for(source: str, task: str, *, median_ms: float = 1.0, eager_ms: float = 2.0, passed: bool = True,
                backend: str = "cute", track: str = "fp32", timed: bool = True) -> Verdict:
    return Verdict(task_id=task, candidate_sha256=source_sha256(source), track=track, backend=backend, passed=passed,
                   stage="timing" if passed else "correctness", failure=None if passed else "compare_outputs",
                   feedback=f"Correct. Median {median_ms:g} ms.", checks=(CheckResult("static", "static", True),),
                   timing=TimingStats(median_ms, median_ms, median_ms, 0.01, 30) if timed else None,
                   eager=TimingStats(eager_ms, eager_ms, eager_ms, 0.01, 30) if timed else None,
                   speedup_vs_eager=eager_ms / median_ms if timed else None, log_tail="a long log")


def library(tmp_path: Path, name: str = "lib.sqlite", arch: str | None = "sm_90", **settings) -> KernelLibrary:
    return KernelLibrary(LibraryConfig(path=tmp_path / name, arch=arch, device_name="NVIDIA H200", **settings))


def add_example(store: KernelLibrary, signatures: dict, file: str, task: str, **kw) -> int | None:
    source = (CANDIDATES / file).read_text()
    return store.add_verdict(TASKS[task], signatures[task], source, verdict_for(source, task, **kw), provenance("test"))


@pytest.fixture()
def filled(tmp_path, signatures) -> KernelLibrary:
    """Four example kernels of four classes: elementwise, reduction, gemm (fp32), norm."""
    store = library(tmp_path)
    add_example(store, signatures, "swish_scale_cute.py", "swish_scale", median_ms=0.5, eager_ms=1.5)
    add_example(store, signatures, "row_softmax_cute.py", "row_softmax")
    add_example(store, signatures, "matmul_cute.py", "matmul", median_ms=0.06, eager_ms=0.015)
    add_example(store, signatures, "layer_norm_cute.py", "layer_norm")
    return store


# ------------------------------------------------------------------------------ store and retrieve


def test_an_entry_comes_back_as_it_was_stored(tmp_path, signatures):
    store = library(tmp_path)
    source = (CANDIDATES / "swish_scale_cute.py").read_text()
    verdict = verdict_for(source, "swish_scale", median_ms=0.5, eager_ms=1.5)
    where = provenance("agent", "anthropic:claude-x", "run-7")
    entry_id = store.add_verdict(TASKS["swish_scale"], signatures["swish_scale"], source, verdict, where)
    back = store.get(str(entry_id))
    assert back.entry_id == entry_id and store.get(back.content_sha256[:10]) == back
    assert back.content_sha256 == source_sha256(source) == verdict.candidate_sha256
    assert back.task_sha256 == TASKS["swish_scale"].source_sha256 and back.signature == signatures["swish_scale"]
    assert back.signature.op_class == "elementwise" and back.signature.input_shapes == ((256, 4096),)
    assert back.signature.params == ("1.5",)  # the constructor's scale
    assert (back.backend, back.track, back.arch, back.device_name) == ("cute", "fp32", "sm_90", "NVIDIA H200")
    assert (back.measured.median_ms, back.measured.eager_median_ms, back.measured.speedup_vs_eager) == (0.5, 1.5, 3.0)
    assert back.provenance == where and back.verdict == dataclasses.replace(verdict, log_tail="")
    assert store.entries(op_class="elementwise") == [back] and store.entries(op_class="gemm") == []


def test_neighbours_rank_op_class_first_then_dtypes_then_sizes(filled, signatures):
    def nearest(task: str, **kw) -> list[str]:
        return [e.task_id for e, _ in filled.neighbours(signatures[task], backend="cute", track="fp32",
                                                        task=TASKS[task], **kw)]

    # A bf16 GEMM: the fp32 GEMM first (same class, though another dtype), then the rest by size.
    assert nearest("matmul_bf16")[0] == "matmul"
    # linear_gelu (a fused chain): no entry of its class; all fp32, no shared op: the nearest sizes.
    ranked = filled.neighbours(signatures["linear_gelu"], backend="cute", track="fp32", task=TASKS["linear_gelu"])
    assert all(d.other_class == 1 for _, d in ranked)
    assert [d.shape_distance for _, d in ranked] == sorted(d.shape_distance for _, d in ranked)
    # A task's own entries only when asked.
    assert "swish_scale" not in nearest("swish_scale")
    assert nearest("swish_scale", same_task=True)[0] == "swish_scale"


def test_examples_carry_the_measured_speed_and_a_note_for_another_arch(tmp_path, filled, signatures):
    examples = filled.examples(TASKS["matmul_bf16"], signatures["matmul_bf16"], backend="cute", track="fp32", k=2)
    assert [e.task_id for e in examples] == ["matmul", "layer_norm"] or len(examples) == 2
    first = examples[0]
    assert first.source == (CANDIDATES / "matmul_cute.py").read_text().strip() + "\n"
    assert first.speed.startswith("median 0.06 ms, 0.25x eager PyTorch; measured on NVIDIA H200 (sm_90)")
    assert first.note is None
    elsewhere = KernelLibrary(dataclasses.replace(filled.config, arch="sm_100"))
    noted = elsewhere.examples(TASKS["matmul_bf16"], signatures["matmul_bf16"], backend="cute", track="fp32", k=1)
    assert "measured on sm_90, not on this run's sm_100" in noted[0].note


def test_retrieval_shows_only_verified_timed_kernels_of_the_backend_family_and_a_strict_enough_track(tmp_path, signatures):
    store = library(tmp_path)
    swish = (CANDIDATES / "swish_scale_cute.py").read_text()
    with pytest.raises(ValueError, match="did not pass"):  # a rejected kernel never enters
        store.add_verdict(TASKS["swish_scale"], signatures["swish_scale"], swish,
                          verdict_for(swish, "swish_scale", passed=False), provenance("test"))
    with pytest.raises(ValueError, match="is not the one the verdict judged"):  # nor another source than judged
        store.add_verdict(TASKS["swish_scale"], signatures["swish_scale"], swish + "\nx = 1\n",
                          verdict_for(swish, "swish_scale"), provenance("test"))
    add_example(store, signatures, "swish_scale_cute.py", "swish_scale", timed=False)  # stored, never shown
    add_example(store, signatures, "row_softmax_cute.py", "row_softmax", track="tf32")
    add_example(store, signatures, "layer_norm_cute.py", "layer_norm", backend="torch")
    add_example(store, signatures, "matmul_cute.py", "matmul", backend="cuda")
    assert len(store.entries()) == 4

    def shown(backend: str, track: str) -> set[str]:
        return {e.task_id for e, _ in store.neighbours(signatures["matmul_bf16"], backend=backend, track=track)}

    assert shown("cute", "fp32") == {"matmul"}  # cuda serves cute; tf32, torch and untimed do not
    assert shown("cute", "tf32") == {"matmul", "row_softmax"}  # an fp32 kernel passes tf32's looser tolerance
    assert shown("torch", "fp32") == {"layer_norm"}


def test_the_same_kernel_is_one_entry(tmp_path, signatures):
    store = library(tmp_path)
    assert add_example(store, signatures, "swish_scale_cute.py", "swish_scale") is not None
    assert add_example(store, signatures, "swish_scale_cute.py", "swish_scale", median_ms=0.7) is None
    source = (CANDIDATES / "swish_scale_cute.py").read_text()
    reformatted = source.replace("\n", "   \r\n")  # the same kernel to Python: the same hash
    assert store.add_verdict(TASKS["swish_scale"], signatures["swish_scale"], reformatted,
                             verdict_for(source, "swish_scale"), provenance("test")) is None
    assert [e.measured.median_ms for e in store.entries()] == [1.0]  # the first measurement is kept
    # Judged under another backend, or on another machine: another entry.
    assert add_example(store, signatures, "swish_scale_cute.py", "swish_scale", backend="cuda") is not None
    other = KernelLibrary(dataclasses.replace(store.config, arch="sm_80"))
    assert add_example(other, signatures, "swish_scale_cute.py", "swish_scale") is not None
    assert len(store.entries()) == 3 and arch_name("sm_90a") == arch_name("9.0") == "sm_90"


# ------------------------------------------------------------------------------ the file


def test_a_version_1_file_is_migrated_and_keeps_its_kernels(tmp_path, signatures):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, '2026-01-01T00:00:00+00:00')")
    fresh = library(tmp_path, "scratch.sqlite")  # a row as version 1 wrote it: the columns it had
    add_example(fresh, signatures, "row_softmax_cute.py", "row_softmax")
    row = sqlite3.connect(tmp_path / "scratch.sqlite").execute("SELECT * FROM kernels").fetchone()
    names = [c[1] for c in sqlite3.connect(tmp_path / "scratch.sqlite").execute("PRAGMA table_info(kernels)")]
    values = {n: v for n, v in zip(names, row) if n != "device_name"}
    conn.execute(f"INSERT INTO kernels ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", list(values.values()))
    conn.commit()
    conn.close()
    store = library(tmp_path, "old.sqlite")
    versions = sqlite3.connect(path).execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    assert [v for (v,) in versions] == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION == 2
    (old,) = store.entries()
    assert old.task_id == "row_softmax" and old.device_name is None and old.measured.speedup_vs_eager == 2.0
    assert add_example(store, signatures, "matmul_cute.py", "matmul") is not None
    assert store.entries()[1].device_name == "NVIDIA H200"
    assert [e.task_id for e, _ in store.neighbours(signatures["row_softmax"], backend="cute", track="fp32",
                                                   same_task=True)][0] == "row_softmax"


def test_a_corrupt_file_and_a_newer_schema_are_refused_with_the_file_and_the_fix(tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"these are not the pages of an SQLite database\n" * 200)
    with pytest.raises(ConfigError) as caught:
        KernelLibrary(LibraryConfig(path=corrupt))
    assert str(corrupt) in caught.value.problem and f"mv {corrupt} {corrupt}.broken" in caught.value.fix
    newer = library(tmp_path, "newer.sqlite")
    with sqlite3.connect(newer.path) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 'later')", (SCHEMA_VERSION + 1,))
    with pytest.raises(ConfigError) as caught:
        KernelLibrary(LibraryConfig(path=newer.path))
    assert str(newer.path) in caught.value.problem and "newer than this cutegen" in caught.value.problem
    assert "Upgrade cutegen" in caught.value.fix
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(ConfigError, match="not a cutegen kernel library"):
        KernelLibrary(LibraryConfig(path=foreign))


SIGNATURE = TaskSignature("elementwise", ("relu",), "relu", ((64, 64),), ("float32",), ((64, 64),), ("float32",),
                          (), 0, 32768)


def _writer(path: str, number: int, count: int, start) -> str:
    """One process's writes: `count` distinct kernels, one transaction each, after the common start.
    Says how it went in text (an exception would not come back through the pool)."""
    from cutegen.library import new_entry
    from cutegen.records import KernelMeasurement

    start.wait()
    try:
        store = KernelLibrary(LibraryConfig(path=Path(path), arch="cpu", busy_timeout_s=0.005, retries=200))
        task = Task(task_id=f"writer{number}", name=f"writer{number}", path=Path("t.py"), source="",
                    source_sha256="t" * 64)
        for i in range(count):
            source = f"# writer {number}, kernel {i}\nclass ModelNew: pass\n"
            measured = KernelMeasurement(1.0 + i, 2.0, None, 2.0 / (1.0 + i), None, None, None, "ok")
            store.add(new_entry(task, SIGNATURE, source, backend="cuda", track="fp32", arch="cpu", device_name=None,
                                measured=measured, where=provenance("test")))
    except Exception as err:  # noqa: BLE001 - reported to the test, which fails on it
        return f"{type(err).__name__}: {err}"
    return "ok"


def test_parallel_writers_lose_no_entry(tmp_path):
    """Four processes open a new file at once (the migrations applied once) and add 30 kernels each, one
    transaction at a time. A lock wait of 5 ms sends them through the retries: without retries the same
    run lost whole writers (measured once: of four, one failed to open and two added none of their 30)."""
    path, writers, count = tmp_path / "shared.sqlite", 4, 30
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(writers)
        with context.Pool(writers) as pool:
            done = pool.starmap(_writer, [(str(path), n, count, start) for n in range(writers)])
    assert done == ["ok"] * writers
    store = KernelLibrary(LibraryConfig(path=path))
    entries = store.entries()
    assert len(entries) == writers * count == len({e.content_sha256 for e in entries})
    assert {e.task_id for e in entries} == {f"writer{n}" for n in range(writers)}
    versions = sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchall()
    assert sorted(v for (v,) in versions) == list(range(1, SCHEMA_VERSION + 1))  # each migration applied once
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# ------------------------------------------------------------------------------ runs, prune, export


def test_a_run_shows_the_examples_chosen_when_its_task_started(tmp_path, filled, signatures):
    """Resume is replay: the examples are journaled, so a kernel added later does not change the prompt."""
    journal = Journal.create(tmp_path / "run")
    task = TASKS["matmul_bf16"]

    def pick() -> tuple:
        return examples_for_task(journal, task, signatures["matmul_bf16"], filled, k=1, same_task=False,
                                 backend="cute", track="fp32")

    first = pick()
    assert [e.task_id for e in first] == ["matmul"]
    add_example(filled, signatures, "gemm_bf16_wgmma.py", "matmul_bf16", median_ms=0.02, eager_ms=0.06)
    gemm_like = Task(task_id="bf16_gemm_2", name="g", path=task.path, source=task.source + "\n# 2\n",
                     source_sha256="x" * 64)
    later = examples_for_task(Journal.create(tmp_path / "other"), gemm_like, signatures["matmul_bf16"], filled, k=1,
                              same_task=False, backend="cute", track="fp32")
    assert [e.task_id for e in later] == ["matmul_bf16"]  # a new run would now pick the bf16 kernel...
    assert pick() == first  # ...this one keeps what it showed
    journal.append("reply", task_id="linear_gelu", request_sha256="r")  # begun before examples were journaled
    assert examples_for_task(journal, TASKS["linear_gelu"], signatures["linear_gelu"], filled, k=2, same_task=False,
                             backend="cute", track="fp32") == ()


def test_prune_keeps_the_fastest_of_each_task(tmp_path, signatures):
    store = library(tmp_path)
    add_example(store, signatures, "matmul_cute.py", "matmul", median_ms=0.06)
    add_example(store, signatures, "matmul_3xtf32_cute.py", "matmul", median_ms=0.025)
    add_example(store, signatures, "row_softmax_cute.py", "row_softmax")
    assert [e.task_id for e in store.prune(keep=1, dry_run=True)] == ["matmul"] and len(store.entries()) == 3
    (gone,) = store.prune(keep=1)
    assert gone.measured.median_ms == 0.06 and len(store.entries()) == 2
    assert store.prune(before="2000-01-01") == [] and len(store.prune(before="9999-01-01")) == 2
    with pytest.raises(ConfigError, match="nothing to remove"):
        store.prune()


def test_export_writes_a_kernelbench_file_and_a_torch_op(filled):
    (entry,) = filled.entries(task="matmul")
    text, name = export_entry(entry, "kernelbench")
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))  # the wrapped comment
    assert name == "matmul.py" and f"from run test, kernel library entry {entry.entry_id}" in header
    assert "0.25x vs eager PyTorch" in header and "from cutegen.runtime import CuteKernel" not in text
    ast.parse(text)
    op_text, op_name = export_entry(entry, "torch-op")
    assert op_name == "matmul_op.py" and f"torch.ops.cutegen.matmul_{entry.content_sha256[:8]}" in op_text
    ast.parse(op_text)
    with pytest.raises(ConfigError, match="not one of"):
        export_entry(entry, "zip")


def test_kernelbench_tasks_find_kernels_of_their_class_in_the_measured_library(kernelbench_root, tmp_path):
    """bench/library_retrieval.py's library (the repository's candidates with their H200 verdicts) on a
    few KernelBench tasks: a ReLU finds elementwise kernels, a GEMM the GEMMs, a convolution followed
    by a ReLU and a bias the fused chain first and the convolution next."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("library_retrieval", REPO / "bench" / "library_retrieval.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    suite = {t.task_id: t for t in load_tasks(kernelbench_root, "level1,level2")}
    store = KernelLibrary(LibraryConfig(path=tmp_path / "kb.sqlite", arch="sm_90"))
    assert script.build(store, suite) == len(store.entries()) >= 60
    entries = store.entries()
    assert {e.arch for e in entries} == {"sm_90"} and {e.device_name for e in entries} == {"NVIDIA H200"}
    rows = {r["task"]: r for r in script.retrieve(store, {i: suite[i] for i in ("level1/19", "level1/2", "level2/1")})}
    assert [cls for _, cls, _ in rows["level1/19"]["neighbours"]] == ["elementwise"] * 3
    assert "level1/19" not in [task for task, _, _ in rows["level1/19"]["neighbours"]]  # its own kernels left out
    assert [cls for _, cls, _ in rows["level1/2"]["neighbours"]][:2] == ["gemm", "gemm"]
    assert [task for task, _, _ in rows["level2/1"]["neighbours"]][:2] == ["level2/76", "conv2d"]
