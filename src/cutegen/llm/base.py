"""The provider protocol, request ids, signals and the price table shared by every adapter."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Protocol, runtime_checkable

from cutegen.errors import ConfigError, CutegenError
from cutegen.records import Reply, Request, to_json


@runtime_checkable
class Provider(Protocol):
    """A language model behind one method.

    `model_id` is the stable name of the model ("anthropic:claude-sonnet-4-5", "exchange",
    "replay"); it enters every request id, so it never holds a path or a URL (a run directory
    moved to another machine keeps its ids).

    `complete(request)` sends the whole message list (system prompt included) and returns the
    `Reply` with its token counts, dollars and latency. Transient failures (rate limits, 5xx,
    timeouts, dropped connections) are retried inside the adapter with exponential backoff; what
    escapes is final:
    - `ReplyPending`: the reply is not there yet (exchange: a person or another program answers
      through files); ask again later, nothing was spent;
    - `ProviderError`: the request was refused, the reply was malformed, or the retries ran out;
    - `ConfigError`: the credentials were rejected (the message names the variable to set).
    """

    model_id: str

    async def complete(self, request: Request) -> Reply: ...


class ProviderError(CutegenError):
    """A model call failed in a way that retrying the same request will not fix."""


class ReplyPending(Exception):
    """The reply to a request is not available yet; `path` is where it is expected."""

    def __init__(self, request_sha256: str, path: Path) -> None:
        self.request_sha256 = request_sha256
        self.path = path
        super().__init__(f"waiting for a reply in {path}")


def request_sha256(request: Request, model_id: str) -> str:
    """The id of a request: sha256 of its canonical JSON with the model id.

    Task, stage and call index are part of it, so a prompt asked twice is two calls (models sample)
    while a replayed run computes the same ids again.
    """
    body = {"model": model_id, **to_json(request)}
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# ------------------------------------------------------------------------------------------- prices


def load_price_table(override: Path | None = None) -> dict[str, tuple[float, float]]:
    """USD per million (input, output) tokens by model-name prefix; `override` entries win.

    The file format is `{"models": {"claude-sonnet-4-5": {"input": 3.0, "output": 15.0}, ...}}`.
    """
    text = resources.files("cutegen.llm").joinpath("prices.json").read_text(encoding="utf-8")
    table = _parse_prices(json.loads(text), "the built-in price table")
    if override is not None:
        try:
            data = json.loads(Path(override).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"Price table {override} cannot be read as JSON ({err}).",
                'Give a JSON file like {"models": {"my-model": {"input": 1.0, "output": 2.0}}}'
                " (USD per million tokens).",
            ) from None
        table.update(_parse_prices(data, str(override)))
    return table


def _parse_prices(data: object, where: str) -> dict[str, tuple[float, float]]:
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ConfigError(f"{where} has no 'models' object.", 'Use {"models": {NAME: {"input": X, "output": Y}}}.')
    table = {}
    for name, entry in models.items():
        try:
            table[name] = (float(entry["input"]), float(entry["output"]))
        except (TypeError, KeyError, ValueError):
            raise ConfigError(
                f"{where}: the entry for model {name!r} needs numeric 'input' and 'output' prices.",
                "Give USD per million tokens, e.g. {\"input\": 3.0, \"output\": 15.0}.",
            ) from None
    return table


def price_usd(
    table: dict[str, tuple[float, float]], model: str, input_tokens: int | None, output_tokens: int | None
) -> float | None:
    """Dollars for one call, by the longest table entry the model name starts with (dated model
    names such as claude-sonnet-4-5-20250929 match their family); None when unknown."""
    if input_tokens is None or output_tokens is None:
        return None
    matches = [name for name in table if model == name or model.startswith(name + "-")]
    if not matches:
        return None
    per_in, per_out = table[max(matches, key=len)]
    return (input_tokens * per_in + output_tokens * per_out) / 1e6
