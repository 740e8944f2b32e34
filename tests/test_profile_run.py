"""Running ncu: the command, the isolation, and graceful degradation when no profile can be made.

A stand-in `ncu` executable (a small script written per test, standing in for the external tool, not
for project code) behaves like ncu does when it is denied the counters, hangs, rejects a metric, or
profiles a candidate that crashes, so every failure path runs here on a CPU. The real ncu runs in
tests/test_profile_gpu.py and tests/test_profile_agreement_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutegen.config import EvalConfig, ProfileConfig
from cutegen.profile import ProfileUnavailable, collect, make_profiler
from cutegen.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "swish_scale.py"
CANDIDATE = REPO / "examples" / "candidates" / "swish_scale_cute.py"

FAKE_NCU = r'''#!{python}
import json, os, subprocess, sys, time
MODE = {mode!r}
LOG = {log!r}
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2099.1.0 (build fake)")
    sys.exit(0)
if args == ["--query-metrics"]:
    print("Metric Name   Metric Type   Metric Unit   Metric Description")
    print("gpu__time_duration   Counter   nsecond   duration")
    print("dram__bytes_read   Counter   byte   bytes read")
    sys.exit(0)
with open(LOG, "a") as log:
    log.write(json.dumps({{"argv": args, "cwd": os.getcwd(), "env": sorted(os.environ),
                          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\n")
if MODE == "hang":
    child = subprocess.Popen(["sleep", "600"])
    open(LOG + ".child", "w").write(str(child.pid))
    time.sleep(600)
elif MODE == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
elif MODE == "reject":
    print("==ERROR== Failed to prepare metric collection")
    sys.exit(1)
elif MODE == "crash":
    print("Traceback (most recent call last):\n  File \"candidate.py\", line 3\nZeroDivisionError: division by zero")
    sys.exit(1)
elif MODE == "nokernels":
    open("done.json", "w").write("{{}}")
    print("==WARNING== No kernels were profiled.")
    sys.exit(0)
'''


def fake_ncu(tmp_path: Path, mode: str) -> tuple[str, Path]:
    log = tmp_path / f"ncu-{mode}.log"
    script = tmp_path / f"ncu-{mode}"
    script.write_text(FAKE_NCU.format(python=sys.executable, mode=mode, log=str(log)))
    script.chmod(0o755)
    return str(script), log


def runs(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def attempt(tmp_path: Path, mode: str, **config) -> tuple[ProfileUnavailable, list[dict]]:
    ncu, log = fake_ncu(tmp_path, mode)
    with pytest.raises(ProfileUnavailable) as caught:
        collect(CANDIDATE.read_text(), load_task(TASK), ProfileConfig(ncu=ncu, **config), EvalConfig(gpus=(3,)))
    return caught.value, runs(log)


def test_missing_ncu_is_a_clear_message(tmp_path):
    with pytest.raises(ProfileUnavailable) as caught:
        collect("", load_task(TASK), ProfileConfig(ncu=str(tmp_path / "no-ncu")), EvalConfig())
    assert caught.value.reason == "ncu_missing" and "--ncu" in str(caught.value)


def test_ncu_command_isolation_and_permission_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "secret")
    error, (run,) = attempt(tmp_path, "perm")
    assert error.reason == "no_permission" and "ERR_NVGPUCTRPERM" in str(error)
    argv = run["argv"]
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[argv.index("--profile-from-start") + 1] == "off"
    assert argv[-4:] == [sys.executable, "-m", "cutegen.profile.driver", "job.json"]
    requested = argv[argv.index("--metrics") + 1].split(",")
    assert {"gpu__time_duration.sum", "dram__bytes_read.sum", "launch__registers_per_thread"} <= set(requested)
    # only what this ncu lists (and launch statistics, which it need not list): no hit rates here
    assert all(m.split(".")[0] in ("gpu__time_duration", "dram__bytes_read") or m.startswith(("launch__", "device__"))
               for m in requested)
    assert run["cuda_visible_devices"] == "3" and "ANTHROPIC_API_KEY" not in run["env"]
    job = Path(run["cwd"]) / "job.json"
    assert not job.exists()  # the fresh folder is removed afterwards


def test_timeout_kills_ncu_and_the_candidate(tmp_path):
    started = time.perf_counter()
    error, _ = attempt(tmp_path, "hang", timeout_s=3.0)
    assert error.reason == "timeout" and time.perf_counter() - started < 30
    pid = int((tmp_path / "ncu-hang.log.child").read_text())
    for _ in range(50):  # the killed child is reaped by init shortly after
        status = Path(f"/proc/{pid}/status")
        if not status.exists() or "\nState:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the candidate's process {pid} survived the timeout")


def test_a_rejected_request_is_retried_with_fewer_metrics(tmp_path):
    error, attempts = attempt(tmp_path, "reject")
    assert error.reason == "ncu_failed"
    sections = [[a for i, a in enumerate(run["argv"]) if run["argv"][i - 1] == "--section"] for run in attempts]
    assert [len(s) for s in sections] == [6, 6, 1] and sections[2] == ["SpeedOfLight"]
    metric_lists = [run["argv"][run["argv"].index("--metrics") + 1] if "--metrics" in run["argv"] else None
                    for run in attempts]
    assert metric_lists[1] is None and len(metric_lists[2].split(",")) < len(metric_lists[0].split(","))


def test_a_failing_candidate_is_not_retried(tmp_path):
    error, attempts = attempt(tmp_path, "crash")
    assert error.reason == "candidate_failed" and "ZeroDivisionError" in str(error) and len(attempts) == 1


def test_no_kernels(tmp_path):
    error, _ = attempt(tmp_path, "nokernels")
    assert error.reason == "no_kernels"


def test_agent_profiler_degrades_to_no_profile_and_stops_after_a_permanent_failure(tmp_path):
    ncu, log = fake_ncu(tmp_path, "perm")
    messages: list[str] = []
    profiler = make_profiler(ProfileConfig(ncu=ncu), notify=messages.append)
    task = load_task(TASK)
    assert profiler(CANDIDATE, task, EvalConfig()) is None
    assert profiler(CANDIDATE, task, EvalConfig()) is None
    assert len(runs(log)) == 1 and len(messages) == 1 and "no_permission" in messages[0]
    assert profiler(CANDIDATE, task, EvalConfig(device="cpu", backend="torch")) is None


def test_cli_reports_no_profile_with_exit_status_1(tmp_path):
    ncu, _ = fake_ncu(tmp_path, "perm")
    done = subprocess.run([sys.executable, "-m", "cutegen", "profile", str(CANDIDATE), "--task", str(TASK),
                           "--ncu", ncu, "--json"], capture_output=True, text=True, env={**os.environ})
    assert done.returncode == 1
    assert json.loads(done.stdout)["unavailable"]["reason"] == "no_permission"
    assert "no profile (no_permission)" in done.stderr and "Traceback" not in done.stderr


def test_interpret_keeps_the_candidates_kernels_and_measures_against_speed_of_light(tmp_path):
    from cutegen.profile import interpret
    from cutegen.profile.run import Collected

    library = tmp_path / "kernel.so"  # stands for the built library: it names the two demo kernels
    library.write_bytes(b"\x7fELF...\x00_ZN4demo11copy_kernelEPKfPfl\x00_ZN4demo14reduce_partialEPKfPfi\x00")
    csv_text = (REPO / "tests" / "fixtures" / "ncu" / "synthetic_raw.csv").read_text()
    meta = {"libraries": [str(library)], "device_name": "NVIDIA H200", "torch_version": "none", "dtype": "float32"}
    collected = Collected(csv_text=csv_text, meta=meta, tool="ncu test", metrics_missing=(), sections_only=False,
                          log_tail="", ncu_s=1.0)
    eval_config = EvalConfig(cache_dir=tmp_path / "eval")
    config = ProfileConfig(cuobjdump=str(tmp_path / "no-cuobjdump"))
    profile = interpret(collected, CANDIDATE.read_text(), load_task(TASK), config, eval_config)
    assert [k.name.split("demo")[1][:6] for k in profile.kernels] == ["11copy", "14redu"]
    assert len(profile.other_kernels) == 1 and profile.diagnosis == "memory-bound"
    bound = 2 * 256 * 4096 * 4 / 4800e9  # task bytes over the H200 datasheet bandwidth (no measured peaks cached)
    assert profile.sol_bound_s == pytest.approx(bound)
    assert profile.sol_fraction == pytest.approx(bound / 124e-6)
    assert profile.findings == ("cuobjdump not found: no instruction mix",)
