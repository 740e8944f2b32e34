"""The GPU machine's scripts in bench/, on the CPU: a mistake here costs a whole device call.

What they may be: arrangements of CLI calls and public functions (no private name of cutegen), each
under 150 lines; what they measure is the CLI's, and the GPU checks are pytest tests marked gpu.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
MAX_LINES = 150


def _script(name: str):
    sys.path.insert(0, str(BENCH))  # the scripts import their neighbours (_common.py, throughput_report.py)
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def private_imports(path: Path) -> list[str]:
    """`from cutegen... import _name` and `cutegen...._name` attribute uses in a script."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cutegen"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            found += [node.module] if any(part.startswith("_") for part in node.module.split(".")) else []
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("cutegen") and "._" in a.name]
    return found


def test_every_script_is_short_and_uses_no_private_name():
    scripts = sorted(BENCH.glob("*.py")) + sorted(BENCH.glob("*.sh"))
    assert (BENCH / "h200_all.sh") in scripts and len(scripts) > 3
    long = {p.name: n for p in scripts if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"over {MAX_LINES} lines: {long}"
    private = {p.name: found for p in scripts if p.suffix == ".py" and (found := private_imports(p))}
    assert private == {}


def test_the_private_name_rule_catches_each_form(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from cutegen.evaluate.sol import _time_ms\nfrom cutegen.evaluate._x import y\nimport cutegen._y\n"
                   "from cutegen.evaluate.sol import get_peaks\n")
    assert private_imports(bad) == ["cutegen.evaluate.sol._time_ms", "cutegen.evaluate._x", "cutegen._y"]


def test_two_baseline_files_are_compared_task_by_task(tmp_path):
    def state(eager_ms, job):
        row = {"eager": {"median_ms": eager_ms}, "compiled": None, "noise_pct": 0.5, "worker_job": job}
        return {"tasks": {"level1/10": {"tracks": {"fp32": row}}, "level1/9": {"tracks": {"fp32": row, "tf32": row}}},
                "runs": [{"started_utc": "2026-12-01T10:00"}], "manifest": {"gpu_name": "H200"}}

    (tmp_path / "a.json").write_text(json.dumps(state(2.0, None)))
    b = state(2.1, 3)
    b["tasks"].pop("level1/10")  # measured in one file only: left out
    (tmp_path / "b.json").write_text(json.dumps(b))
    run = subprocess.run([sys.executable, str(BENCH / "compare_baselines.py"), str(tmp_path / "a.json"),
                          str(tmp_path / "b.json"), "--out", str(tmp_path / "c.md"), "--label-b", "reused"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "fp32 eager: n 1, median +5.00%" in run.stdout and "tf32 eager: n 1" in run.stdout
    table = (tmp_path / "c.md").read_text()
    assert "| level1/9 | fp32 | eager | 2 | 2.1 | +5.00 | 0.50 / 0.50 | - / 3 |" in table
    assert "level1/10" not in table
    (tmp_path / "bad.json").write_text("{}")
    run = subprocess.run([sys.executable, str(BENCH / "compare_baselines.py"), str(tmp_path / "bad.json"),
                          str(tmp_path / "b.json"), "--out", str(tmp_path / "c.md")], capture_output=True, text=True)
    assert run.returncode == 2 and "no 'tasks' in it" in run.stderr


def test_the_throughput_report_of_the_recorded_parts_is_the_table_of_record(tmp_path):
    """Parts S and T, merged again, give bench/results/throughput-h200.md and .json exactly."""
    results = REPO / "bench" / "results"
    run = subprocess.run([sys.executable, str(BENCH / "throughput_report.py"), "--out", str(tmp_path),
                          str(results / "throughput-h200-partS.json"), str(results / "throughput-h200-partT.json")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "throughput-h200.md").read_text() == (results / "throughput-h200.md").read_text()
    assert json.loads((tmp_path / "throughput-h200.json").read_text()) == json.loads(
        (results / "throughput-h200.json").read_text())


def test_variants_are_distinct_sources_with_their_own_extension(tmp_path):
    made = _script("throughput_h200").with_variants(REPO / "bench" / "candidates" / "cuda", 3, tmp_path)
    first = sorted(made.glob("level_1_problem_19_sample_*_kernel.py"))
    assert [p.name[-18:] for p in first] == ["sample_0_kernel.py", "sample_1_kernel.py", "sample_2_kernel.py"]
    texts = [p.read_text() for p in first]
    assert len(set(texts)) == 3 and "multiProcessorCount * 8" in texts[2] and "_s2\"" in texts[2]


def _python3_on_path(tmp_path: Path) -> dict[str, str]:
    """The environment of a script that calls `python3`: this interpreter, and cutegen from this checkout."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    wrapper = tmp_path / "bin" / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a symlink would lose the virtualenv
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}


def test_a_throughput_part_runs_the_bench_through_the_cli(tmp_path):
    """One part on the CPU: the honest torch candidate of swish_scale judged by `cutegen bench --evaluate`,
    its verdict and the machine's manifest in the part's file, its table written."""
    env = _python3_on_path(tmp_path)
    run = subprocess.run(["python3", str(BENCH / "throughput_h200.py"), "--out", str(tmp_path / "out"), "--kernelbench",
                          str(REPO / "examples" / "tasks"), "--select", "swish_scale", "--part", "cpu", "--candidates",
                          str(REPO / "tests" / "fixtures" / "honest"), "--budget-s", "240", "--extra",
                          "--backend torch --device cpu --timing-trials 3 --correctness-trials 1 --no-compile-baseline"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    part = json.loads((tmp_path / "out" / "throughput-h200-cpu.json").read_text())
    (verdict,) = part["bench"]["verdicts"]
    assert verdict["task_id"] == "swish_scale" and verdict["passed"] and verdict["median_ms"] > 0
    assert part["bench"]["status"] == 0 and part["manifest"]["cpu_count"] and "$OUT" in part["bench"]["command"]
    assert "1 of 1 evaluations passed, over 1 tasks." in (tmp_path / "out" / "throughput-h200.md").read_text()


def test_the_driver_runs_a_step_by_name(tmp_path):
    env = _python3_on_path(tmp_path)
    done = subprocess.run(["bash", str(BENCH / "h200_all.sh"), "--run-step", "machine", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "machine.json").read_text())["manifest"]["python_version"]
    usage = subprocess.run(["bash", str(BENCH / "h200_all.sh")], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "name the steps" in usage.stdout


@pytest.mark.parametrize("step", ["prebuild", "machine", "gpu_tests", "survey", "throughput", "shared_gpu", "split_build"])
def test_every_step_the_driver_names_has_a_limit_and_commands(step):
    text = (BENCH / "h200_all.sh").read_text()
    assert f"#   {step} (" in text  # documented at the top
    done = subprocess.run(["bash", "-c", f'source <(sed -n "/^limit_of()/,/^}}/p" {BENCH / "h200_all.sh"}); limit_of {step}'],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and int(done.stdout) >= 60
    assert f"    {step})" in text or f"    {step}) " in text
