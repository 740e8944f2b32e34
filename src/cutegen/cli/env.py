"""Environment variables the CLI understands, turned into typed config (library code never reads them)."""

from __future__ import annotations

import os
from pathlib import Path

from cutegen.config import RuntimeConfig, default_cache_root

# CUTEGEN_CACHE: root for build and measurement caches (default ~/.cache/cutegen)
# CUTEGEN_CUTLASS_INCLUDE (or CUTLASS_PATH, a checkout root): headers instead of the nvidia-cutlass wheel
# CUTEGEN_NVCC: the nvcc to use (default: PATH, then /usr/local/cuda/bin/nvcc)
# CUTEGEN_ARCH: e.g. sm_90a, to compile without a GPU


def cache_root() -> Path:
    value = os.environ.get("CUTEGEN_CACHE")
    return Path(value).expanduser() if value else default_cache_root()


def runtime_config() -> RuntimeConfig:
    include = os.environ.get("CUTEGEN_CUTLASS_INCLUDE")
    if not include and os.environ.get("CUTLASS_PATH"):
        include = str(Path(os.environ["CUTLASS_PATH"]) / "include")
    return RuntimeConfig(
        cache_dir=cache_root() / "build",
        nvcc=os.environ.get("CUTEGEN_NVCC") or None,
        cutlass_include=Path(include).expanduser() if include else None,
        arch=os.environ.get("CUTEGEN_ARCH") or None,
    )
