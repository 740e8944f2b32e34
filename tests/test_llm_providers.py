"""The SDK adapters against the SDKs' own request building and response parsing, without a network:
an in-process HTTP transport answers with canned JSON in each vendor's wire format."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys

import pytest

from cutegen.config import ProviderSettings
from cutegen.errors import ConfigError
from cutegen.llm import ProviderError, provider_from_spec, request_sha256
from cutegen.records import Message, Request

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

# The installed SDK may warn that a model name used here is deprecated; the names are only test data.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REQUEST = Request(
    messages=(Message("system", "You write kernels."), Message("user", "Make swish fast.")),
    max_tokens=123, task_id="swish_scale", stage="generate", seq=0,
)
FAST_RETRY = dict(retry_initial_s=0.0, retry_max_s=0.0)


def _http_module(sdk):
    """The HTTP library the installed SDK is built on (httpx, or its successor), found from the SDK."""
    return importlib.import_module(sdk.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])


class Server:
    """Answers each request with the next canned (status, body) and keeps the parsed request bodies."""

    def __init__(self, sdk, answers):
        self.http = _http_module(sdk)
        self.answers = list(answers)
        self.bodies: list[dict] = []
        self.urls: list[str] = []

    def handler(self, request):
        self.bodies.append(json.loads(request.content))
        self.urls.append(str(request.url))
        status, body = self.answers.pop(0)
        if isinstance(body, str):
            return self.http.Response(status, text=body, headers={"content-type": "application/json"})
        return self.http.Response(status, json=body)

    def client(self):
        return self.http.AsyncClient(transport=self.http.MockTransport(self.handler))


def anthropic_message(text="```python\nclass ModelNew: pass\n```", stop="end_turn", model="claude-sonnet-4-5-20250929"):
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 1000, "output_tokens": 200}}


def openai_completion(text="hello", finish="stop", model="gpt-5-2025-08-07"):
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}}


RATE_LIMITED = (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})


def run(provider, request=REQUEST):
    return asyncio.run(provider.complete(request))


def test_anthropic_maps_system_prompt_and_counts_cost():
    server = Server(anthropic, [(200, anthropic_message())])
    provider = provider_from_spec("anthropic:claude-sonnet-4-5", ProviderSettings(anthropic_api_key="k"),
                                  http_client=server.client())
    reply = run(provider)
    body = server.bodies[0]
    assert body["system"] == "You write kernels."
    assert body["messages"] == [{"role": "user", "content": "Make swish fast."}]
    assert body["max_tokens"] == 123 and body["model"] == "claude-sonnet-4-5"
    assert server.urls[0].endswith("/v1/messages")
    assert reply.text.startswith("```python") and reply.provider == "anthropic"
    assert (reply.input_tokens, reply.output_tokens) == (1000, 200)
    # claude-sonnet-4-5 lists at $3 / $15 per million tokens; the dated name matches its family.
    assert reply.cost_usd == pytest.approx((1000 * 3 + 200 * 15) / 1e6)
    assert reply.request_sha256 == request_sha256(REQUEST, "anthropic:claude-sonnet-4-5")
    assert reply.attempts == 1 and not reply.truncated and not reply.recorded


def test_anthropic_rate_limit_is_retried_then_succeeds():
    server = Server(anthropic, [RATE_LIMITED, (200, anthropic_message(stop="max_tokens"))])
    provider = provider_from_spec("anthropic:claude-sonnet-4-5", ProviderSettings(anthropic_api_key="k", **FAST_RETRY),
                                  http_client=server.client())
    reply = run(provider)
    assert reply.attempts == 2 and len(server.bodies) == 2
    assert reply.truncated  # stop_reason max_tokens


def test_server_errors_retried_up_to_the_explicit_count():
    error = (503, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    server = Server(anthropic, [error] * 3)
    settings = ProviderSettings(anthropic_api_key="k", max_retries=2, **FAST_RETRY)
    provider = provider_from_spec("anthropic:claude-haiku-4-5", settings, http_client=server.client())
    with pytest.raises(ProviderError, match="after 3 tries"):
        run(provider)
    assert len(server.bodies) == 3  # 1 try + 2 retries, no more


def test_bad_request_is_not_retried():
    server = Server(anthropic, [(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                  "message": "max_tokens too large"}})])
    provider = provider_from_spec("anthropic:claude-sonnet-4-5", ProviderSettings(anthropic_api_key="k", **FAST_RETRY),
                                  http_client=server.client())
    with pytest.raises(ProviderError, match="max_tokens too large"):
        run(provider)
    assert len(server.bodies) == 1


def test_missing_keys_name_the_variable():
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        provider_from_spec("anthropic:claude-sonnet-4-5", ProviderSettings())
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        provider_from_spec("openai:gpt-5", ProviderSettings())
    with pytest.raises(ConfigError, match="CUTEGEN_BASE_URL"):
        provider_from_spec("openai-compatible:qwen", ProviderSettings())


def test_rejected_key_is_a_config_error_naming_the_variable():
    server = Server(openai, [(401, {"error": {"message": "Incorrect API key", "type": "invalid_request_error"}})])
    provider = provider_from_spec("openai:gpt-5", ProviderSettings(openai_api_key="bad"), http_client=server.client())
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        run(provider)


def test_openai_maps_messages_and_truncation():
    server = Server(openai, [RATE_LIMITED, (200, openai_completion(finish="length"))])
    provider = provider_from_spec("openai:gpt-5", ProviderSettings(openai_api_key="k", **FAST_RETRY),
                                  http_client=server.client())
    reply = run(provider)
    body = server.bodies[-1]
    assert body["messages"][0] == {"role": "system", "content": "You write kernels."}
    assert body["messages"][1] == {"role": "user", "content": "Make swish fast."}
    assert body["max_completion_tokens"] == 123 and "max_tokens" not in body
    assert reply.truncated and reply.attempts == 2
    assert reply.cost_usd == pytest.approx((1000 * 1.25 + 200 * 10) / 1e6)


def test_openai_compatible_uses_the_url_in_the_spec_and_max_tokens():
    server = Server(openai, [(200, openai_completion(model="Qwen/Qwen3-32B"))])
    provider = provider_from_spec("openai-compatible:Qwen/Qwen3-32B@http://127.0.0.1:8000/v1", ProviderSettings(),
                                  http_client=server.client())
    reply = run(provider)
    assert server.urls[0] == "http://127.0.0.1:8000/v1/chat/completions"
    assert server.bodies[0]["model"] == "Qwen/Qwen3-32B" and server.bodies[0]["max_tokens"] == 123
    assert provider.model_id == "openai-compatible:Qwen/Qwen3-32B"  # no URL: ids survive a server move
    assert reply.cost_usd is None  # not in the price table: unknown, not free


def test_malformed_replies_are_clear_provider_errors():
    no_choices = openai_completion()
    no_choices["choices"] = []
    server = Server(openai, [(200, no_choices)])
    provider = provider_from_spec("openai:gpt-5", ProviderSettings(openai_api_key="k"), http_client=server.client())
    with pytest.raises(ProviderError, match="malformed reply"):
        run(provider)
    empty = anthropic_message()
    empty["content"] = []
    server = Server(anthropic, [(200, empty)])
    provider = provider_from_spec("anthropic:claude-sonnet-4-5", ProviderSettings(anthropic_api_key="k"),
                                  http_client=server.client())
    with pytest.raises(ProviderError, match="no text"):
        run(provider)


def test_a_body_that_is_not_json_is_retried_then_reported():
    server = Server(anthropic, [(200, "<html>bad gateway</html>"), (200, anthropic_message(text="ok"))])
    provider = provider_from_spec("anthropic:claude-sonnet-4-5", ProviderSettings(anthropic_api_key="k", **FAST_RETRY),
                                  http_client=server.client())
    assert run(provider).text == "ok"
    server = Server(openai, [(200, "<html>bad gateway</html>")] * 2)
    settings = ProviderSettings(openai_api_key="k", max_retries=1, **FAST_RETRY)
    provider = provider_from_spec("openai:gpt-5", settings, http_client=server.client())
    with pytest.raises(ProviderError, match="not JSON"):
        run(provider)
    assert len(server.bodies) == 2


def test_sdks_are_imported_only_when_used():
    code = ("import sys, cutegen.llm, cutegen.agent, cutegen.cli.agent_cmd;"
            "print(sorted(m for m in ('anthropic', 'openai', 'tenacity', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
