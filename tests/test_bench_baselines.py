"""bench/baselines_kernelbench_h200.py on the CPU: both tracks' baselines, the precompile's cache hit,
the probe's flags, resumption from a state file and from a killed run's output.

The script runs as it does on the GPU machine (a subprocess, evaluator workers), over a two-task suite
laid out like KernelBench: level1/1 is swish_scale (examples/tasks), level1/2 the degenerate
shifted_relu fixture (its output is 0 everywhere, so the probe must flag it). The GPU run itself is
the `baselines` step of bench/h200_all.sh.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "baselines_kernelbench_h200.py"
RESULT = "baselines-h200.json"


def script_module():
    if str(REPO / "bench") not in sys.path:  # the script imports the probe script from its own folder
        sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module("baselines_kernelbench_h200")


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("suite")
    (root / "level1").mkdir()
    shutil.copy(REPO / "examples" / "tasks" / "swish_scale.py", root / "level1" / "1_swish_scale.py")
    shutil.copy(REPO / "tests" / "fixtures" / "tasks" / "shifted_relu.py", root / "level1" / "2_shifted_relu.py")
    return root


def run_script(suite: Path, work: Path, out: Path, *extra: str) -> tuple[str, dict]:
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--kernelbench", str(suite), "--levels", "1",
               "--device", "cpu", "--timing-trials", "3", "--work", str(work), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=work.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads((out / RESULT).read_text())


@pytest.fixture(scope="module")
def first_run(suite, tmp_path_factory) -> tuple[Path, str, dict]:
    """level1/1, both tracks, with torch.compile: precompiled in a worker, then measured."""
    base = tmp_path_factory.mktemp("first")
    stdout, data = run_script(suite, base / "work", base / "out", "--select", "level1/1", "--state", "none",
                              "--compile-jobs", "2")
    return base, stdout, data


def test_both_tracks_have_eager_and_compile_results_and_the_manifest(first_run):
    _, stdout, data = first_run
    tracks = data["tasks"]["level1/1"]["tracks"]
    assert sorted(tracks) == ["fp32", "tf32"]
    for row in tracks.values():
        assert row["eager"]["median_ms"] > 0 and row["eager"]["trials"] == 3
        assert row["eager_repeat"]["median_ms"] > 0
        assert (row["compiled"] or {}).get("median_ms", 0) > 0 or row["compile_error"]
        assert row["sol_bound_ms"] is None and "CUDA" in row["sol_error"]  # no peaks on a CPU
        assert row["device_name"].startswith("cpu")
    assert data["manifest"]["torch_version"] and data["manifest"]["cpu_count"]
    assert data["kernelbench"]["folder"].startswith("suite")  # the folder's name, not its path
    (run,) = data["runs"]
    assert sorted(run["added"]) == ["level1/1:fp32", "level1/1:probe", "level1/1:tf32"]
    assert run["manifest"] == data["manifest"] and run["finished_utc"]
    assert "[2/2] level1/1 tf32" in stdout
    # one worker measured both tracks, one after the other
    assert (tracks["fp32"]["worker_job"], tracks["tf32"]["worker_job"]) == (1, 2)
    assert (first_run[0] / "out" / RESULT.replace(".json", ".md")).read_text().count("| level1/1 ") == 1


def test_the_precompile_fills_the_cache_the_measurement_hits(first_run):
    _, _, data = first_run
    tracks = data["tasks"]["level1/1"]["tracks"]
    errors = [row["compile_error"] for row in tracks.values() if row["compile_error"]]
    if errors:
        pytest.skip(f"torch.compile does not work in this environment: {errors[0][:300]}")
    for row in tracks.values():
        assert row["precompile"]["ok"], row["precompile"]
        # The measured compile found its FX graph in the cache the precompile wrote: no new entry.
        assert row["fx_graph_entries_added"] == 0


def test_a_killed_run_is_merged_and_a_finished_state_measures_nothing(suite, first_run, tmp_path):
    _, _, first = first_run
    # A run killed after its first (task, track): its output holds level1/1 fp32 and the probe only.
    killed = json.loads(json.dumps(first))
    del killed["tasks"]["level1/1"]["tracks"]["tf32"]
    out = tmp_path / "out"
    out.mkdir()
    (out / RESULT).write_text(json.dumps(killed))
    # Eager only and one track, to keep the test short: level1/1 tf32 and level1/2 tf32 are left to do.
    stdout, data = run_script(suite, tmp_path / "work", out, "--state", "none", "--no-compile", "--tracks", "tf32")
    assert "2 tasks, 2 (task, track)s and 1 probes to do" in stdout
    fp32 = data["tasks"]["level1/1"]["tracks"]["fp32"]
    assert fp32 == first["tasks"]["level1/1"]["tracks"]["fp32"]  # kept, not measured again
    assert data["runs"][0] == first["runs"][0]
    assert sorted(data["runs"][1]["added"]) == ["level1/1:tf32", "level1/2:probe", "level1/2:tf32"]
    assert data["tasks"]["level1/2"]["tracks"]["tf32"]["eager"]["median_ms"] > 0
    probe = data["summary"]["probe"]
    assert probe["flagged_1e-4"] == ["level1/2"] and probe["tasks_probed"] == 2
    assert "zeros" in data["tasks"]["level1/2"]["probe"]["trivial@0.0001"]
    assert data["tasks"]["level1/2"]["probe"]["precision"] == "float32"
    assert data["tasks"]["level1/2"]["probe"]["mismatch@0.01"]["zeros"] == 0.0  # 0 everywhere

    # The finished file as --state, a fresh --out: nothing to measure, nothing added.
    again = tmp_path / "again"
    stdout, resumed = run_script(suite, tmp_path / "work", again, "--state", str(out / RESULT), "--no-compile",
                                 "--tracks", "tf32")
    assert "0 (task, track)s and 0 probes to do" in stdout
    assert resumed["tasks"] == data["tasks"] and resumed["runs"] == data["runs"]


def test_merge_keeps_the_newest_entry_and_a_changed_task_is_measured_again():
    b = script_module()
    old = {"schema": 1, "runs": [{"id": "r1", "started_utc": "1"}], "tasks": {"level1/1": {
        "source_sha256": "aaa", "probe": None, "tracks": {"fp32": {"measured_utc": "1", "v": "old"}}}}}
    new = {"schema": 1, "runs": [{"id": "r2", "started_utc": "2"}], "tasks": {"level1/1": {
        "source_sha256": "aaa", "probe": {"measured_utc": "2"}, "tracks": {
            "fp32": {"measured_utc": "0", "v": "older"}, "tf32": {"measured_utc": "2", "v": "new"}}}}}
    merged = b.merge_states(old, new)
    tracks = merged["tasks"]["level1/1"]["tracks"]
    assert tracks["fp32"]["v"] == "old" and tracks["tf32"]["v"] == "new"
    assert [r["id"] for r in merged["runs"]] == ["r1", "r2"]
    assert b.entry_done({"compile_error": None, "compiled": None}, want_compile=False, retry_errors=False)
    assert not b.entry_done({"compile_error": None, "compiled": None}, want_compile=True, retry_errors=False)
    assert not b.entry_done({"error": "x"}, want_compile=True, retry_errors=False)  # tried once more
    assert b.entry_done({"error": "x", "attempts": 2}, want_compile=True, retry_errors=False)
    assert not b.entry_done({"error": "x", "attempts": 2}, want_compile=True, retry_errors=True)

    class Task:
        task_id, source_sha256 = "level1/1", "bbb"  # the source changed since it was measured

    args = type("Args", (), {"tracks": ["fp32", "tf32"], "compile": True, "retry_errors": False, "probe": True})
    planned = [(t.task_id, tracks, probe) for t, tracks, probe in b.plan([Task()], merged, args)]
    assert planned == [("level1/1", ["fp32", "tf32"], True)]


def test_a_probe_of_an_earlier_kind_is_done_again_and_left_out_of_the_flags():
    b = script_module()
    done = {"compiled": {"median_ms": 1.0}, "compile_error": None}
    kinds = {1: {},  # the reference in eval mode
             2: {"mode": "train"},  # training mode, no failed fractions
             3: {"mode": "train", "mismatch@0.01": {"input_copy:0": 0.0}}}
    tasks = {f"level1/{i}": {"source_sha256": "aaa", "level": 1, "tracks": {"fp32": done, "tf32": done},
                             "probe": {"trivial@0.0001": ["input_copy:0"], **kind}} for i, kind in kinds.items()}
    state = {"schema": 1, "runs": [], "tasks": tasks}

    class Task:
        def __init__(self, task_id):
            self.task_id, self.source_sha256 = task_id, "aaa"

    args = type("Args", (), {"tracks": ["fp32", "tf32"], "compile": True, "retry_errors": False, "probe": True})
    planned = [(t.task_id, tracks, probe) for t, tracks, probe in b.plan([Task(t) for t in tasks], state, args)]
    assert planned == [("level1/1", [], True), ("level1/2", [], True)]
    probe = b.summarize(state, 2)["probe"]
    assert probe["flagged_1e-4"] == ["level1/3"] and probe["stale"] == ["level1/1", "level1/2"]
    assert probe["tasks_probed"] == 1


def test_the_probe_verdict_needs_every_listed_task_found():
    b = script_module()
    probe = sys.modules["probe_kernelbench_h200"]
    rows = [{"task_id": t, "trivial@0.0001": ["zeros"]} for t in sorted(probe.MUST_FLAG)]
    rows += [{"task_id": t, "trivial@0.0001": [], "trivial@0.01": ["constant"]} for t in sorted(probe.NEARLY_CONSTANT)]
    assert b.judge(rows)["verdict"] == "OK"
    # A nearly constant task that a constant fails on a few elements only: found as nearly trivial.
    rows[-1] = {"task_id": rows[-1]["task_id"], "trivial@0.01": [], "near_trivial@0.01": ["zeros"]}
    assert b.judge(rows)["verdict"] == "OK" and b.judge(rows)["nearly_constant_missed"] == []
    rows[-1] = {"task_id": rows[-1]["task_id"], "trivial@0.01": [], "near_trivial@0.01": []}
    verdict = b.judge(rows)
    assert verdict["verdict"] == "CHECK" and verdict["nearly_constant_missed"] == [rows[-1]["task_id"]]
    assert b.judge(rows[:-1])["verdict"] == "OK"  # a listed task not probed yet does not count


def test_the_bound_follows_the_track_and_the_half_precision_peak():
    from cutegen.evaluate.sol import datasheet_peaks
    from cutegen.records import TimingStats
    from cutegen.tasks import load_task

    b = script_module()
    peaks = datasheet_peaks("NVIDIA H200")
    eager = TimingStats(median_ms=1.0, mean_ms=1.0, min_ms=1.0, iqr_ms=0.0, trials=3)
    trace = b.trace_of(load_task(REPO / "examples" / "tasks" / "matmul_bf16.py"))
    # fp32 track: CUDA cores or 3xTF32 (a third of the TF32 rate), whichever is faster; bf16: the half peak.
    flops_ms = {track: trace.flops / (tflops * 1e12) * 1e3 for track, tflops in
                (("fp32", max(peaks.fp32_tflops, peaks.tf32_tflops / 3)), ("half", peaks.half_tflops))}
    fp32 = b.sol_fields(trace, peaks, "fp32", None, eager, None)  # no probe: the fp32 rule
    assert fp32["sol_bound_ms"] == pytest.approx(max(flops_ms["fp32"], trace.min_bytes / (peaks.bandwidth_gb_s * 1e6)))
    assert fp32["sol_fraction_eager"] == pytest.approx(fp32["sol_bound_ms"]) and "assumed" in fp32["sol_precision"]
    half = b.sol_fields(trace, peaks, "tf32", "bfloat16", eager, None)
    assert half["sol_bound_ms"] == pytest.approx(max(flops_ms["half"], trace.min_bytes / (peaks.bandwidth_gb_s * 1e6)))
    assert b.sol_fields(trace, None, "fp32", None, eager, None)["sol_bound_ms"] is None
    assert "trace failed" in b.sol_fields("SyntaxError", peaks, "fp32", None, eager, None)["sol_error"]


def test_a_chunk_holds_what_the_budget_left_can_measure_and_none_starts_below_the_estimate(tmp_path):
    b = script_module()
    args = b.parse_args(["--out", str(tmp_path), "--device", "cpu", "--state", "none", "--work", str(tmp_path),
                         "--chunk", "3"])
    runner = b.Runner(args, {"schema": 1, "tasks": {}, "runs": []}, [], {"id": "r", "added": []})
    runner.unit_s = [10.0, 30.0, 40.0]  # median 30 s: 45 s per (task, track) estimated
    assert runner.estimate_s() == pytest.approx(45.0)
    pending = [(f"task{i}", ["fp32", "tf32"] if i == 0 else ["fp32"], True) for i in range(5)]
    runner.deadline = b.time.monotonic() + 40.0
    assert runner.next_chunk(pending) == []  # nothing precompiled, nothing measured
    runner.deadline = b.time.monotonic() + 140.0  # three (task, track)s fit: a task's tracks stay together
    assert runner.next_chunk(pending) == pending[:2]
    runner.deadline = b.time.monotonic() + 10_000.0  # --chunk bounds it
    assert runner.next_chunk(pending) == pending[:2] and runner.next_chunk(pending[2:]) == pending[2:5]
    assert runner.run["added"] == [] and runner.done == 0


def test_two_baseline_files_are_compared_task_by_task(tmp_path):
    def state(eager_ms, job):
        row = {"eager": {"median_ms": eager_ms}, "compiled": None, "noise_pct": 0.5, "worker_job": job}
        return {"tasks": {"level1/10": {"tracks": {"fp32": row}}, "level1/9": {"tracks": {"fp32": row, "tf32": row}}},
                "runs": [{"started_utc": "2026-12-01T10:00"}], "manifest": {"gpu_name": "H200"}}

    (tmp_path / "a.json").write_text(json.dumps(state(2.0, None)))
    b = state(2.1, 3)
    b["tasks"].pop("level1/10")  # measured in one file only: left out
    (tmp_path / "b.json").write_text(json.dumps(b))
    run = subprocess.run([sys.executable, str(REPO / "bench" / "compare_baselines.py"), str(tmp_path / "a.json"),
                          str(tmp_path / "b.json"), "--out", str(tmp_path / "c.md"), "--label-b", "reused"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "fp32 eager: n 1, median +5.00%" in run.stdout and "tf32 eager: n 1" in run.stdout
    table = (tmp_path / "c.md").read_text()
    assert "| level1/9 | fp32 | eager | 2 | 2.1 | +5.00 | 0.50 / 0.50 | - / 3 |" in table
    assert "level1/10" not in table
    (tmp_path / "bad.json").write_text("{}")
    run = subprocess.run([sys.executable, str(REPO / "bench" / "compare_baselines.py"), str(tmp_path / "bad.json"),
                          str(tmp_path / "b.json"), "--out", str(tmp_path / "c.md")], capture_output=True, text=True)
    assert run.returncode == 2 and "no 'tasks' in it" in run.stderr
