"""Environment variables the CLI understands, turned into typed config (library code never reads them)."""

from __future__ import annotations

import os
from pathlib import Path

from cutegen.config import ProfileConfig, ProviderSettings, RuntimeConfig, default_cache_root
from cutegen.errors import ConfigError

# CUTEGEN_CACHE: root for build and measurement caches (default ~/.cache/cutegen)
# CUTEGEN_CUTLASS_INCLUDE (or CUTLASS_PATH, a checkout root): headers instead of the nvidia-cutlass wheel
# CUTEGEN_NVCC: the nvcc to use (default: PATH, then /usr/local/cuda/bin/nvcc)
# CUTEGEN_ARCH: e.g. sm_90a, to compile without a GPU
# CUTEGEN_NCU: the Nsight Compute binary for profile feedback (default: PATH, then /usr/local/cuda/bin)


def cache_root() -> Path:
    value = os.environ.get("CUTEGEN_CACHE")
    return Path(value).expanduser() if value else default_cache_root()


# CUTEGEN_LIBRARY: the kernel library file (default: library.sqlite in CUTEGEN_CACHE when that is set,
# else in $XDG_CACHE_HOME/cutegen, else in ~/.cache/cutegen)


def library_path() -> Path:
    value = os.environ.get("CUTEGEN_LIBRARY")
    if value:
        return Path(value).expanduser()
    if os.environ.get("CUTEGEN_CACHE"):
        return cache_root() / "library.sqlite"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() / "cutegen" if xdg else default_cache_root()) / "library.sqlite"


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


# Model providers (cutegen optimize / resume):
# ANTHROPIC_API_KEY, OPENAI_API_KEY: keys of the anthropic: and openai: providers
# CUTEGEN_OPENAI_COMPATIBLE_API_KEY: key of an openai-compatible: server (local servers need none)
# CUTEGEN_BASE_URL: the server of openai-compatible:MODEL when the spec has no @URL
# CUTEGEN_PRICE_TABLE: a JSON price table overriding the built-in one (USD per million tokens)
# CUTEGEN_LLM_RETRIES, CUTEGEN_LLM_TIMEOUT_S: retries of transient failures, seconds per request
# CUTEGEN_REPLAY_DELAY_S: a pause before each replayed reply (for tests that interrupt a run)


def provider_settings(state_dir: Path | None = None) -> ProviderSettings:
    def number(name: str, default: float) -> float:
        value = os.environ.get(name)
        try:
            return float(value) if value else default
        except ValueError:
            raise ConfigError(f"{name}={value!r} is not a number.", f"Set {name} to a number or unset it.") from None

    price = os.environ.get("CUTEGEN_PRICE_TABLE")
    return ProviderSettings(
        anthropic_api_key=os.environ.get("ANTHROPIC_API_KEY") or None,
        openai_api_key=os.environ.get("OPENAI_API_KEY") or None,
        compatible_api_key=os.environ.get("CUTEGEN_OPENAI_COMPATIBLE_API_KEY") or None,
        base_url=os.environ.get("CUTEGEN_BASE_URL") or None,
        max_retries=int(number("CUTEGEN_LLM_RETRIES", 4)),
        timeout_s=number("CUTEGEN_LLM_TIMEOUT_S", 600.0),
        price_table=Path(price).expanduser() if price else None,
        state_dir=state_dir,
        replay_delay_s=number("CUTEGEN_REPLAY_DELAY_S", 0.0),
    )


def profile_config() -> ProfileConfig:
    return ProfileConfig(ncu=os.environ.get("CUTEGEN_NCU") or None)
