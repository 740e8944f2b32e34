"""Adapters over the vendors' SDKs: Anthropic, OpenAI and OpenAI-compatible servers.

Each SDK is imported when its adapter is built, never before: the GPU machine and a run with the
replay or exchange provider need none of them. The SDKs' own retries are turned off
(`max_retries=0`) so that the retry count is ours and explicit (`ProviderSettings.max_retries`):
tenacity retries transient failures only (HTTP 408/409/429/5xx, timeouts, dropped connections),
with full-jitter exponential backoff that honours a server's `retry-after` header.
"""

from __future__ import annotations

import importlib
import random
import time
from typing import Any

from cutegen.config import ProviderSettings
from cutegen.errors import ConfigError
from cutegen.llm.base import ProviderError, load_price_table, price_usd, request_sha256
from cutegen.records import Reply, Request

_TRANSIENT_STATUS = {408, 409, 429, 529}


def _import_sdk(name: str, spec: str) -> tuple[Any, Any]:
    try:
        return importlib.import_module(name), importlib.import_module("tenacity")
    except ImportError as err:
        raise ConfigError(
            f"Provider {spec!r} needs the Python package {err.name!r}, which is not installed.",
            f"Install it with `pip install {name} tenacity` (only the machine that calls the model needs it).",
        ) from None


class _SdkProvider:
    """The shared part: retries, timing, cost; subclasses build the client, send and parse."""

    provider = ""  # the provider kind, e.g. "anthropic"
    sdk_name = ""  # the SDK module to import
    key_variable = ""  # the environment variable the CLI reads the key from

    def __init__(self, model: str, settings: ProviderSettings, *, http_client: Any = None) -> None:
        if not model:
            raise ConfigError(
                f"The {self.provider} provider needs a model name.",
                f"Write it as {self.provider}:MODEL, e.g. anthropic:claude-sonnet-4-5 or openai:gpt-5.",
            )
        self.model = model
        self.model_id = f"{self.provider}:{model}"
        self.settings = settings
        self._sdk, self._tenacity = _import_sdk(self.sdk_name, self.model_id)
        self._http_client = http_client
        self._client: Any = None  # built on first use, inside the running event loop
        self._prices = load_price_table(settings.price_table)

    async def complete(self, request: Request) -> Reply:
        rid = request_sha256(request, self.model_id)
        if self._client is None:
            self._client = self._make_client()
        started = time.monotonic()
        attempts = 0
        try:
            async for attempt in self._retrying():
                with attempt:
                    attempts += 1
                    raw = await self._send(request)
        except self._sdk.AuthenticationError as err:
            raise ConfigError(
                f"{self.provider} rejected the API key ({_status_text(err)}).",
                f"Set {self.key_variable} to a valid key for {self.model_id}.",
            ) from None
        except self._sdk.APIError as err:
            raise ProviderError(self._failure_text(err, attempts), self._failure_fix(err)) from None
        except ValueError as err:  # a body that is not JSON, e.g. a proxy's error page sent with 200
            raise ProviderError(f"{self.model_id} returned a malformed reply (not JSON: {err}) {attempts} time(s).",
                                "Check the base URL (it must reach the API, not a web page); retry later.") from None
        text, model, tokens_in, tokens_out, truncated = self._parse_checked(raw)
        return Reply(
            text=text, provider=self.provider, model=model, request_sha256=rid,
            input_tokens=tokens_in, output_tokens=tokens_out,
            cost_usd=price_usd(self._prices, model, tokens_in, tokens_out) if model else None,
            latency_s=round(time.monotonic() - started, 3), truncated=truncated, attempts=attempts,
        )

    def _retrying(self) -> Any:
        t = self._tenacity
        return t.AsyncRetrying(
            stop=t.stop_after_attempt(self.settings.max_retries + 1),
            wait=self._wait,
            retry=t.retry_if_exception(self._transient),
            reraise=True,
        )

    def _transient(self, err: BaseException) -> bool:
        if isinstance(err, (self._sdk.APIConnectionError, ValueError)):  # timeouts; garbled bodies
            return True
        status = getattr(err, "status_code", None)
        return isinstance(err, self._sdk.APIStatusError) and (status in _TRANSIENT_STATUS or status >= 500)

    def _wait(self, state: Any) -> float:
        # Full jitter (a random wait up to the exponential step) spreads the retries of concurrent
        # tasks; a server's retry-after is a floor.
        step = self.settings.retry_initial_s * 2 ** (state.attempt_number - 1)
        wait = random.uniform(0, min(step, self.settings.retry_max_s))
        err = state.outcome.exception() if state.outcome else None
        response = getattr(err, "response", None)
        header = response.headers.get("retry-after") if response is not None else None
        try:
            wait = max(wait, float(header)) if header else wait
        except ValueError:
            pass  # an HTTP date: the exponential step is a fine approximation
        return min(wait, self.settings.retry_max_s)

    def _parse_checked(self, raw: Any) -> tuple[str, str, int | None, int | None, bool]:
        try:
            parsed = self._parse(raw)
            detail = "the reply holds no text"
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as err:
            parsed, detail = None, f"{type(err).__name__}: {err}"
        if parsed is None or not parsed[0].strip():
            raise ProviderError(
                f"{self.model_id} returned a malformed reply ({detail}).",
                "Retry later; if it persists, check that the model name and base URL point at a chat model.",
            )
        return parsed

    def _failure_text(self, err: Any, attempts: int) -> str:
        if self._transient(err):
            return f"{self.model_id} still failed after {attempts} tries: {_status_text(err)}."
        return f"{self.model_id} refused the request: {_status_text(err)}."

    def _failure_fix(self, err: Any) -> str:
        if self._transient(err):
            return "Wait and resume the run (`cutegen resume RUN`), or raise the retry count."
        return "Check the model name and the account's access to it; the message above is the server's."

    # Subclasses: the client, the request, the reply.
    def _make_client(self) -> Any:
        raise NotImplementedError

    async def _send(self, request: Request) -> Any:
        raise NotImplementedError

    def _parse(self, raw: Any) -> tuple[str, str, int | None, int | None, bool]:
        raise NotImplementedError


def _status_text(err: Any) -> str:
    status = getattr(err, "status_code", None)
    message = str(getattr(err, "message", "") or err)[:500]
    return f"HTTP {status}: {message}" if status else f"{type(err).__name__}: {message}"


class AnthropicProvider(_SdkProvider):
    """anthropic:MODEL: the Messages API; system messages go to the separate `system=` field."""

    provider = "anthropic"
    sdk_name = "anthropic"
    key_variable = "ANTHROPIC_API_KEY"

    def __init__(self, model: str, settings: ProviderSettings, *, http_client: Any = None) -> None:
        if not settings.anthropic_api_key:
            raise ConfigError(
                f"The model anthropic:{model} needs an Anthropic API key and ANTHROPIC_API_KEY is not set.",
                "Export ANTHROPIC_API_KEY=... (from console.anthropic.com), or pick another --model.",
            )
        super().__init__(model, settings, http_client=http_client)

    def _make_client(self) -> Any:
        return self._sdk.AsyncAnthropic(
            api_key=self.settings.anthropic_api_key, base_url=self.settings.base_url,
            timeout=self.settings.timeout_s, max_retries=0, http_client=self._http_client,
        )

    async def _send(self, request: Request) -> Any:
        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        turns = [{"role": m.role, "content": m.content} for m in request.messages if m.role != "system"]
        extra = {} if self.settings.temperature is None else {"temperature": self.settings.temperature}
        if system:
            extra["system"] = system
        return await self._client.messages.create(
            model=self.model, max_tokens=request.max_tokens, messages=turns, **extra
        )

    def _parse(self, raw: Any) -> tuple[str, str, int | None, int | None, bool]:
        text = "".join(block.text for block in raw.content if getattr(block, "type", "") == "text")
        usage = raw.usage
        return text, raw.model or self.model, usage.input_tokens, usage.output_tokens, raw.stop_reason == "max_tokens"


class OpenAIProvider(_SdkProvider):
    """openai:MODEL and openai-compatible:MODEL[@BASE_URL]: Chat Completions, system message first."""

    sdk_name = "openai"

    def __init__(
        self, model: str, settings: ProviderSettings, *, compatible: bool = False, base_url: str | None = None,
        http_client: Any = None,
    ) -> None:
        self.provider = "openai-compatible" if compatible else "openai"
        self.key_variable = "CUTEGEN_OPENAI_COMPATIBLE_API_KEY" if compatible else "OPENAI_API_KEY"
        self.base_url = base_url or settings.base_url
        if compatible and not self.base_url:
            raise ConfigError(
                f"The model openai-compatible:{model} has no server address.",
                "Write it as openai-compatible:MODEL@http://HOST:PORT/v1, or set CUTEGEN_BASE_URL.",
            )
        # Local servers (vLLM, SGLang, Ollama) accept any key; hosted ones answer 401, reported then.
        self.api_key = (settings.compatible_api_key or "not-needed") if compatible else settings.openai_api_key
        if not self.api_key:
            raise ConfigError(
                f"The model openai:{model} needs an OpenAI API key and OPENAI_API_KEY is not set.",
                "Export OPENAI_API_KEY=..., or pick another --model.",
            )
        super().__init__(model, settings, http_client=http_client)

    def _make_client(self) -> Any:
        return self._sdk.AsyncOpenAI(
            api_key=self.api_key, base_url=self.base_url, timeout=self.settings.timeout_s,
            max_retries=0, http_client=self._http_client,
        )

    async def _send(self, request: Request) -> Any:
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        extra: dict[str, Any] = {} if self.settings.temperature is None else {"temperature": self.settings.temperature}
        # OpenAI's reasoning models take only max_completion_tokens; many compatible servers only max_tokens.
        extra["max_tokens" if self.provider == "openai-compatible" else "max_completion_tokens"] = request.max_tokens
        return await self._client.chat.completions.create(model=self.model, messages=messages, **extra)

    def _parse(self, raw: Any) -> tuple[str, str, int | None, int | None, bool]:
        choice = raw.choices[0]
        usage = raw.usage
        tokens_in = usage.prompt_tokens if usage is not None else None
        tokens_out = usage.completion_tokens if usage is not None else None
        truncated = choice.finish_reason == "length"
        return choice.message.content or "", raw.model or self.model, tokens_in, tokens_out, truncated
