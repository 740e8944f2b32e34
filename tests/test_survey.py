"""`cutegen survey` on the CPU: both tracks' baselines, the precompile's cache hit, the probe's flags,
resumption from a state file and from a killed run's output.

The command runs as it does on the GPU machine (a subprocess, evaluator workers), over a two-task suite
laid out like KernelBench: level1/1 is swish_scale (examples/tasks), level1/2 the degenerate
shifted_relu fixture (its output is 0 everywhere, so the probe must flag it). The GPU run itself is
the `survey` step of bench/h200_all.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutegen.config import EvalConfig
from cutegen.survey import SurveyConfig, Wanted, measure, table
from cutegen.survey.probe import MUST_FLAG, NEARLY_CONSTANT, judge
from cutegen.survey.run import Runner

REPO = Path(__file__).resolve().parents[1]
RESULT = "baselines-h200.json"


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("suite")
    (root / "level1").mkdir()
    shutil.copy(REPO / "examples" / "tasks" / "swish_scale.py", root / "level1" / "1_swish_scale.py")
    shutil.copy(REPO / "tests" / "fixtures" / "tasks" / "shifted_relu.py", root / "level1" / "2_shifted_relu.py")
    return root


def run_script(suite: Path, work: Path, out: Path, *extra: str) -> tuple[str, dict]:
    command = [sys.executable, "-m", "cutegen", "survey", str(suite), "--out", str(out / RESULT), "--select", "level1",
               "--device", "cpu", "--timing-trials", "3", "--work", str(work), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env["CUTEGEN_CACHE"] = str(work / "cache")  # a fresh cache: nothing measured before
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=work.parent, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads((out / RESULT).read_text())


@pytest.fixture(scope="module")
def first_run(suite, tmp_path_factory) -> tuple[Path, str, dict]:
    """level1/1, both tracks, with torch.compile: precompiled in a worker, then measured. One compile
    job, a 2-core machine's default: two jobs there took 38 CPU-seconds for this run against 30."""
    base = tmp_path_factory.mktemp("first")
    stdout, data = run_script(suite, base / "work", base / "out", "--select", "level1/1", "--compile-jobs", "1")
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
    stdout, data = run_script(suite, tmp_path / "work", out, "--no-compile-baseline", "--tracks", "tf32")
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
    stdout, resumed = run_script(suite, tmp_path / "work", again, "--state", str(out / RESULT),
                                 "--no-compile-baseline", "--tracks", "tf32")
    assert "0 (task, track)s and 0 probes to do" in stdout
    assert resumed["tasks"] == data["tasks"] and resumed["runs"] == data["runs"]


def test_merge_keeps_the_newest_entry_and_a_changed_task_is_measured_again():
    old = {"schema": 1, "runs": [{"id": "r1", "started_utc": "1"}], "tasks": {"level1/1": {
        "source_sha256": "aaa", "probe": None, "tracks": {"fp32": {"measured_utc": "1", "v": "old"}}}}}
    new = {"schema": 1, "runs": [{"id": "r2", "started_utc": "2"}], "tasks": {"level1/1": {
        "source_sha256": "aaa", "probe": {"measured_utc": "2"}, "tracks": {
            "fp32": {"measured_utc": "0", "v": "older"}, "tf32": {"measured_utc": "2", "v": "new"}}}}}
    merged = table.merge_states(old, new)
    tracks = merged["tasks"]["level1/1"]["tracks"]
    assert tracks["fp32"]["v"] == "old" and tracks["tf32"]["v"] == "new"
    assert [r["id"] for r in merged["runs"]] == ["r1", "r2"]
    assert table.entry_done({"compile_error": None, "compiled": None}, want_compile=False, retry_errors=False)
    assert not table.entry_done({"compile_error": None, "compiled": None}, want_compile=True, retry_errors=False)
    assert not table.entry_done({"error": "x"}, want_compile=True, retry_errors=False)  # tried once more
    assert table.entry_done({"error": "x", "attempts": 2}, want_compile=True, retry_errors=False)
    assert not table.entry_done({"error": "x", "attempts": 2}, want_compile=True, retry_errors=True)

    class Task:
        task_id, source_sha256 = "level1/1", "bbb"  # the source changed since it was measured

    planned = [(t.task_id, tracks, probe) for t, tracks, probe in table.plan([Task()], merged, Wanted())]
    assert planned == [("level1/1", ["fp32", "tf32"], True)]


def test_a_probe_of_an_earlier_kind_is_done_again_and_left_out_of_the_flags():
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

    planned = [(t.task_id, tracks, probe) for t, tracks, probe in table.plan([Task(t) for t in tasks], state, Wanted())]
    assert planned == [("level1/1", [], True), ("level1/2", [], True)]
    probe = table.summarize(state, 2)["probe"]
    assert probe["flagged_1e-4"] == ["level1/3"] and probe["stale"] == ["level1/1", "level1/2"]
    assert probe["tasks_probed"] == 1


def test_the_probe_verdict_needs_every_listed_task_found():
    rows = [{"task_id": t, "trivial@0.0001": ["zeros"]} for t in sorted(MUST_FLAG)]
    rows += [{"task_id": t, "trivial@0.0001": [], "trivial@0.01": ["constant"]} for t in sorted(NEARLY_CONSTANT)]
    assert judge(rows)["verdict"] == "OK"
    # A nearly constant task that a constant fails on a few elements only: found as nearly trivial.
    rows[-1] = {"task_id": rows[-1]["task_id"], "trivial@0.01": [], "near_trivial@0.01": ["zeros"]}
    assert judge(rows)["verdict"] == "OK" and judge(rows)["nearly_constant_missed"] == []
    rows[-1] = {"task_id": rows[-1]["task_id"], "trivial@0.01": [], "near_trivial@0.01": []}
    verdict = judge(rows)
    assert verdict["verdict"] == "CHECK" and verdict["nearly_constant_missed"] == [rows[-1]["task_id"]]
    assert judge(rows[:-1])["verdict"] == "OK"  # a listed task not probed yet does not count
    # A listed constant task the probe did not flag fails the verdict: a probe that flags nothing is caught.
    unflagged = [dict(r, **{"trivial@0.0001": []}) if r["task_id"] == "level2/9" else r for r in rows[:-1]]
    assert judge(unflagged)["verdict"] == "CHECK" and judge(unflagged)["must_flag_missed"] == ["level2/9"]


def test_the_bound_follows_the_track_and_the_half_precision_peak():
    from cutegen.evaluate.sol import datasheet_peaks
    from cutegen.records import TimingStats
    from cutegen.tasks import load_task

    peaks = datasheet_peaks("NVIDIA H200")
    eager = TimingStats(median_ms=1.0, mean_ms=1.0, min_ms=1.0, iqr_ms=0.0, trials=3)
    trace = measure.trace_of(load_task(REPO / "examples" / "tasks" / "matmul_bf16.py"))
    # fp32 track: CUDA cores or 3xTF32 (a third of the TF32 rate), whichever is faster; bf16: the half peak.
    flops_ms = {track: trace.flops / (tflops * 1e12) * 1e3 for track, tflops in
                (("fp32", max(peaks.fp32_tflops, peaks.tf32_tflops / 3)), ("half", peaks.half_tflops))}
    fp32 = measure.sol_fields(trace, peaks, "fp32", None, eager, None)  # no probe: the fp32 rule
    assert fp32["sol_bound_ms"] == pytest.approx(max(flops_ms["fp32"], trace.min_bytes / (peaks.bandwidth_gb_s * 1e6)))
    assert fp32["sol_fraction_eager"] == pytest.approx(fp32["sol_bound_ms"]) and "assumed" in fp32["sol_precision"]
    half = measure.sol_fields(trace, peaks, "tf32", "bfloat16", eager, None)
    assert half["sol_bound_ms"] == pytest.approx(max(flops_ms["half"], trace.min_bytes / (peaks.bandwidth_gb_s * 1e6)))
    assert measure.sol_fields(trace, None, "fp32", None, eager, None)["sol_bound_ms"] is None
    assert "trace failed" in measure.sol_fields("SyntaxError", peaks, "fp32", None, eager, None)["sol_error"]


def test_the_hardware_fraction_is_of_the_work_bound_at_the_larger_peaks():
    from cutegen.evaluate.sol import datasheet_peaks
    from cutegen.records import to_json

    sheet = datasheet_peaks("NVIDIA H200")
    slow = {**to_json(sheet), "bandwidth_gb_s": 1000.0, "measured": ["bandwidth_gb_s"]}  # measured below the sheet
    entry = {"trace": {"flops": 0, "min_bytes": 4_800_000_000}, "probe": {"precision": "float32"}}
    row = {"eager": {"median_ms": 2000.0}, "compiled": {"median_ms": 1250.0}}
    # 4.8 GB at the datasheet's 4800 GB/s (not the 1000 measured): 1 ms, over the faster 1250 ms.
    assert table.hardware_fraction(entry, row, "fp32", slow) == pytest.approx(1.0 / 1250.0)
    assert table.hardware_fraction({"trace": {}}, row, "fp32", slow) is None


def test_a_chunk_holds_what_the_budget_left_can_measure_and_none_starts_below_the_estimate(tmp_path):
    evaluation = EvalConfig(device="cpu", backend="torch", cache_dir=tmp_path / "eval")
    config = SurveyConfig(out=tmp_path / RESULT, evaluation=evaluation, inductor_dir=tmp_path, chunk=3)
    runner = Runner(config, {"schema": 1, "tasks": {}, "runs": []}, [], {"id": "r", "added": []})
    runner.unit_s = [10.0, 30.0, 40.0]  # median 30 s: 45 s per (task, track) estimated
    assert runner.estimate_s() == pytest.approx(45.0)
    pending = [(f"task{i}", ["fp32", "tf32"] if i == 0 else ["fp32"], True) for i in range(5)]
    runner.deadline = time.monotonic() + 40.0
    assert runner.next_chunk(pending) == []  # nothing precompiled, nothing measured
    runner.deadline = time.monotonic() + 140.0  # three (task, track)s fit: a task's tracks stay together
    assert runner.next_chunk(pending) == pending[:2]
    runner.deadline = time.monotonic() + 10_000.0  # the chunk size bounds it
    assert runner.next_chunk(pending) == pending[:2] and runner.next_chunk(pending[2:]) == pending[2:5]
    assert runner.run["added"] == [] and runner.done == 0


def test_a_survey_of_another_device_is_refused_and_bad_tracks_are_a_usage_error(tmp_path):
    from cutegen.errors import ConfigError

    state = {"schema": 1, "runs": [], "tasks": {"level1/1": {}}, "device": {"device_name": "NVIDIA H200",
                                                                            "torch_version": "2.11.0"}}
    with pytest.raises(ConfigError, match="measured on NVIDIA H200"):
        table.check_device(state, {"device_name": "NVIDIA A100", "torch_version": "2.11.0"})
    table.check_device(state, {"device_name": "NVIDIA H200", "torch_version": "2.11.0"})  # the same: fine
    done = subprocess.run([sys.executable, "-m", "cutegen", "survey", str(tmp_path), "--out", str(tmp_path / "s.json"),
                           "--tracks", "fp16"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "names no precision track" in done.stderr
    done = subprocess.run([sys.executable, "-m", "cutegen", "survey", str(tmp_path), "--out", str(tmp_path / "s.json"),
                           "--state", str(tmp_path / "mistyped.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is not a file" in done.stderr  # not a silent start afresh


def test_the_recorded_survey_gives_its_summary_and_table_again():
    """bench/results/baselines-h200.json (400 (task, track)s of KernelBench level1 and level2 on the H200,
    written by the script this package replaced): its summary and Markdown table computed again here are
    the ones recorded, to the character."""
    from cutegen.survey.markdown import markdown

    recorded = REPO / "bench" / "results" / "baselines-h200.json"
    state = json.loads(recorded.read_text())
    summary = table.summarize(state, state["summary"]["tasks_left"])
    assert summary == state["summary"]
    assert markdown({**state, "summary": summary}) == recorded.with_suffix(".md").read_text()
