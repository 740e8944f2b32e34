"""`cutegen machine`: the manifest every result file carries and, on a CUDA device, the peaks every
speed-of-light figure is computed from (measured in a worker, beside the datasheet's and the work
bound's, which takes the larger of each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def machine(*args: str, cache) -> dict:
    done = subprocess.run([sys.executable, "-m", "cutegen", "machine", "--json", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "CUTEGEN_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_manifest_names_this_machine_and_no_gpu_means_no_peaks(tmp_path):
    import torch

    found = machine(cache=tmp_path)
    manifest = found["manifest"]
    assert manifest["torch_version"] == torch.__version__ and manifest["cpu_count"] == os.cpu_count()
    if not torch.cuda.is_available():
        assert manifest["gpu_count"] == 0 and found["peaks"] is None
    assert machine("--no-peaks", cache=tmp_path)["peaks"] is None


@pytest.mark.gpu
def test_the_peaks_are_measured_once_and_the_work_bound_takes_the_larger(tmp_path):
    first = machine(cache=tmp_path)
    peaks = first["peaks"]
    measured, bound = peaks["measured"], peaks["work_bound"]
    assert measured["bandwidth_gb_s"] > 100 and measured["half_tflops"] > 10 and "bandwidth_gb_s" in measured["measured"]
    for field in ("bandwidth_gb_s", "fp32_tflops", "tf32_tflops", "half_tflops"):
        sheet = (peaks["datasheet"] or {}).get(field, 0.0)
        assert bound[field] == pytest.approx(max(measured[field], sheet))
    assert machine(cache=tmp_path)["peaks"]["measured"] == measured  # read from the cache, not measured again
    again = machine("--fresh", cache=tmp_path)["peaks"]["measured"]
    assert again["bandwidth_gb_s"] == pytest.approx(measured["bandwidth_gb_s"], rel=0.2)
