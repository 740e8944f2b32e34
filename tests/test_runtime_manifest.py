"""cutegen.manifest: the machine description every benchmark result carries."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from importlib import metadata

import pytest

from cutegen.config import RuntimeConfig
from cutegen.manifest import machine_manifest

FIELDS = {
    "gpu_name", "gpu_count", "gpu_capability", "gpu_memory_gib", "driver_version", "torch_version",
    "cuda_runtime", "nvcc_version", "cutlass_version", "python_version", "python_implementation",
    "platform", "cpu_count", "timestamp_utc",
}


def test_manifest_is_json_ready_and_matches_this_machine():
    manifest = machine_manifest()
    assert set(manifest) == FIELDS
    assert json.loads(json.dumps(manifest)) == manifest
    assert manifest["python_version"] == platform.python_version()
    assert manifest["cpu_count"] == os.cpu_count()
    stamp = dt.datetime.fromisoformat(manifest["timestamp_utc"])
    assert stamp.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.timezone.utc) - stamp).total_seconds()) < 300


def test_manifest_gpu_fields_follow_torch():
    torch = pytest.importorskip("torch")
    manifest = machine_manifest()
    assert manifest["torch_version"] == torch.__version__
    assert manifest["cuda_runtime"] == torch.version.cuda
    if torch.cuda.is_available():
        assert manifest["gpu_count"] == torch.cuda.device_count()
        assert manifest["gpu_name"] == torch.cuda.get_device_name()
    else:
        assert manifest["gpu_count"] == 0
        assert manifest["gpu_name"] is None and manifest["gpu_capability"] is None


def test_missing_nvcc_gives_none_not_an_error(tmp_path):
    assert machine_manifest(RuntimeConfig(nvcc=str(tmp_path / "nvcc")))["nvcc_version"] is None


def test_cutlass_version_from_the_wheel_or_a_checkout(tmp_path):
    try:
        expected = metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        expected = None
    assert machine_manifest()["cutlass_version"] == expected
    version_h = tmp_path / "include" / "cutlass" / "version.h"
    version_h.parent.mkdir(parents=True)
    version_h.write_text("#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 9\n#define CUTLASS_PATCH 2\n")
    manifest = machine_manifest(RuntimeConfig(cutlass_include=tmp_path))
    assert manifest["cutlass_version"] == "checkout:3.9.2"
    assert str(tmp_path) not in json.dumps(manifest)  # no local path in a published manifest
