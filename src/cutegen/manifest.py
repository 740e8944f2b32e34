"""What machine and software a measurement was taken on, as a JSON-ready dict.

Every benchmark result carries this, because a speedup means nothing without the GPU, driver, CUDA,
torch and CUTLASS versions behind it. Each probe is independent and best-effort: a field that cannot
be read (no GPU, no nvidia-smi, no nvcc) is None, never a guess, and no probe can fail the whole.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from cutegen.config import RuntimeConfig
from cutegen.errors import CutegenError
from cutegen.runtime.build import find_nvcc, nvcc_release, nvcc_version


def _gpu() -> dict[str, Any]:
    info: dict[str, Any] = {"gpu_name": None, "gpu_count": None, "gpu_capability": None, "gpu_memory_gib": None}
    try:
        import torch  # lazy: loading torch takes seconds

        if not torch.cuda.is_available():
            info["gpu_count"] = 0  # known: torch sees no device
            return info
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
        )
    except Exception:  # a broken driver must not stop a report from being written
        pass
    return info


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def _torch() -> dict[str, Any]:
    try:
        import torch  # lazy: loading torch takes seconds
    except ImportError:
        return {"torch_version": None, "cuda_runtime": None}
    return {"torch_version": torch.__version__, "cuda_runtime": torch.version.cuda}


def _nvcc(config: RuntimeConfig) -> str | None:
    try:
        return nvcc_release(nvcc_version(find_nvcc(config)))
    except CutegenError:
        return None


def _cutlass(config: RuntimeConfig) -> str | None:
    """The nvidia-cutlass wheel's version, or "checkout:<version from version.h>" for a user's
    checkout (no path: the manifest is published with results)."""
    if config.cutlass_include is None:
        try:
            return metadata.version("nvidia-cutlass")
        except metadata.PackageNotFoundError:
            return None
    root = Path(config.cutlass_include).expanduser()
    for version_h in (root / "cutlass" / "version.h", root / "include" / "cutlass" / "version.h"):
        if version_h.is_file():
            text = version_h.read_text(encoding="utf-8", errors="replace")
            parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                return "checkout:" + ".".join(p.group(1) for p in parts)  # type: ignore[union-attr]
            return "checkout:unknown-version"
    return None


def machine_manifest(config: RuntimeConfig | None = None) -> dict[str, Any]:
    """GPU, driver, CUDA, nvcc, torch, CUTLASS, Python, platform, CPU count and a UTC timestamp.

    `config` says which nvcc and CUTLASS headers the runtime uses (default: RuntimeConfig()).
    Works without a GPU (GPU fields None, gpu_count 0; None when torch is missing) and without nvcc (nvcc_version None).
    """
    config = config or RuntimeConfig()
    manifest: dict[str, Any] = {}
    manifest.update(_gpu())
    manifest["driver_version"] = _driver_version()
    manifest.update(_torch())
    manifest["nvcc_version"] = _nvcc(config)
    manifest["cutlass_version"] = _cutlass(config)
    manifest["python_version"] = platform.python_version()
    manifest["python_implementation"] = sys.implementation.name
    manifest["platform"] = platform.platform()
    manifest["cpu_count"] = os.cpu_count()
    manifest["timestamp_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return manifest
