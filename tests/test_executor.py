"""Executor settings without a cluster: the --executor spec, and the error without ray installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cutegen.cli import main
from cutegen.config import EvalConfig, ExecutorConfig, parse_executor
from cutegen.errors import ConfigError
from cutegen.evaluate.executor import LocalExecutor, make_executor

REPO = Path(__file__).resolve().parents[1]


def test_executor_specs():
    assert parse_executor("local") == ExecutorConfig()
    assert parse_executor("ray") == ExecutorConfig(kind="ray")
    assert parse_executor("ray:10.0.0.5:6379", "fake_gpu") == ExecutorConfig(kind="ray", address="10.0.0.5:6379",
                                                                             resource="fake_gpu")
    for bad in ("slurm", "local:host", ""):
        with pytest.raises(ConfigError, match="--executor local"):
            parse_executor(bad)


def test_the_local_executor_is_made_without_starting_a_process(tmp_path):
    config = EvalConfig(backend="torch", device="cpu", cache_dir=tmp_path)
    with make_executor(None, config) as executor:
        assert isinstance(executor, LocalExecutor) and executor.lanes == 1 and executor.device_available()
        assert executor.slots == 1 + executor.build_jobs and executor.retries == []


def test_without_ray_the_ray_executor_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is missing
    config = EvalConfig(backend="torch", device="cpu", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"pip install \"cutegen\[ray\]\""):
        make_executor(ExecutorConfig(kind="ray"), config)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["optimize", str(REPO / "examples" / "tasks" / "swish_scale.py"), "--model", "replay:none.jsonl",
              "--backend", "torch", "--device", "cpu", "--executor", "ray"])
    assert exit_.value.code == 2
    assert "cutegen[ray]" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # it fails before the run directory is made
