"""Model providers, chosen by a `"provider:model"` string.

    anthropic:MODEL                          Anthropic Messages API (ANTHROPIC_API_KEY)
    openai:MODEL                             OpenAI Chat Completions (OPENAI_API_KEY)
    openai-compatible:MODEL@http://HOST/v1   vLLM, SGLang, Ollama, DeepSeek, Together... (the URL may
                                             instead come from CUTEGEN_BASE_URL)
    exchange:DIR                             requests and replies as files (see `files`)
    replay:FILE                              recorded replies from a JSON-lines file (see `files`)

A relative DIR or FILE is taken relative to `ProviderSettings.state_dir` (the run directory) when it
is set, so a run directory can move between machines; `exchange:` alone is `<state_dir>/exchange`.
No SDK is imported until an adapter that needs it is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cutegen.config import ProviderSettings
from cutegen.errors import ConfigError
from cutegen.llm.base import Provider, ProviderError, ReplyPending, request_sha256
from cutegen.llm.files import ExchangeProvider, ReplayProvider
from cutegen.llm.sdk import AnthropicProvider, OpenAIProvider

__all__ = ["Provider", "ProviderError", "ReplyPending", "provider_from_spec", "request_sha256"]

KINDS = ("anthropic", "openai", "openai-compatible", "exchange", "replay")


def provider_from_spec(spec: str, settings: ProviderSettings | None = None, *, http_client: Any = None) -> Provider:
    """Build the provider a spec names; raises ConfigError naming what is missing (key, URL, file)."""
    settings = settings or ProviderSettings()
    kind, sep, rest = spec.strip().partition(":")
    if not sep or kind not in KINDS:
        raise ConfigError(
            f"Model {spec!r} does not name a provider.",
            "Write PROVIDER:MODEL with PROVIDER one of " + ", ".join(KINDS)
            + " (e.g. anthropic:claude-sonnet-4-5, openai:gpt-5, replay:examples/replays/swish_scale_torch.jsonl).",
        )
    if kind == "anthropic":
        return AnthropicProvider(rest, settings, http_client=http_client)
    if kind in ("openai", "openai-compatible"):
        model, base_url = _split_url(rest) if kind == "openai-compatible" else (rest, None)
        return OpenAIProvider(model, settings, compatible=kind == "openai-compatible", base_url=base_url,
                              http_client=http_client)
    if kind == "exchange":
        return ExchangeProvider(_resolve(rest or "exchange", settings))
    log = settings.state_dir / "replay_served.jsonl" if settings.state_dir else None
    return ReplayProvider(_resolve(rest, settings), delay_s=settings.replay_delay_s, log_path=log)


def _split_url(rest: str) -> tuple[str, str | None]:
    model, at, url = rest.rpartition("@")
    if at and url.startswith(("http://", "https://")):
        return model, url
    return rest, None


def _resolve(path_text: str, settings: ProviderSettings) -> Path:
    if not path_text:
        raise ConfigError("replay: needs a file.",
                          "Write replay:FILE, e.g. replay:examples/replays/swish_scale_torch.jsonl.")
    path = Path(path_text).expanduser()
    if not path.is_absolute() and settings.state_dir is not None:
        path = settings.state_dir / path
    return path
