"""The file-based providers (exchange, replay), provider specs and the price table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cutegen.config import ProviderSettings
from cutegen.errors import ConfigError
from cutegen.llm import ProviderError, ReplyPending, provider_from_spec, request_sha256
from cutegen.llm.base import load_price_table, price_usd
from cutegen.records import Message, Request

REPO = Path(__file__).resolve().parents[1]


def request(seq=0, stage="generate", task="swish_scale", text="Make swish fast."):
    return Request((Message("system", "sys"), Message("user", text)), 1000, task, stage, seq)


def test_request_id_covers_content_task_and_call_index():
    base = request_sha256(request(), "m")
    assert base == request_sha256(request(), "m")
    assert len({base, request_sha256(request(seq=1), "m"), request_sha256(request(task="other"), "m"),
                request_sha256(request(text="x"), "m"), request_sha256(request(), "m2")}) == 5


def test_exchange_writes_the_request_then_reads_the_reply(tmp_path):
    provider = provider_from_spec("exchange:", ProviderSettings(state_dir=tmp_path))
    with pytest.raises(ReplyPending) as pending:
        asyncio.run(provider.complete(request()))
    rid = request_sha256(request(), "exchange")
    folder = tmp_path / "exchange"
    assert pending.value.path == folder / f"{rid}.reply.md"
    body = json.loads((folder / f"{rid}.request.json").read_text())
    assert body["messages"][1] == {"role": "user", "content": "Make swish fast."}
    readable = (folder / f"{rid}.request.md").read_text()
    assert "## system" in readable and "Make swish fast." in readable and f"{rid}.reply.md" in readable
    assert provider.pending() == [folder / f"{rid}.request.json"]
    (folder / f"{rid}.reply.txt").write_text("the answer")
    reply = asyncio.run(provider.complete(request()))
    assert reply.text == "the answer" and reply.provider == "exchange" and reply.request_sha256 == rid
    assert reply.cost_usd is None and provider.pending() == []


def write_replay(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_replay_serves_each_task_in_order_and_logs(tmp_path):
    replay = write_replay(tmp_path / "r.jsonl", [
        {"about": "test data"},
        {"task": "a", "stage": "generate", "text": "a0"},
        {"task": "b", "text": "b0"},
        {"task": "a", "stage": "repair_build", "text": "a1"},
    ])
    provider = provider_from_spec(f"replay:{replay}", ProviderSettings(state_dir=tmp_path / "run"))
    first_b = asyncio.run(provider.complete(request(task="b")))
    second_a = asyncio.run(provider.complete(request(seq=1, stage="repair_build", task="a")))
    first_a = asyncio.run(provider.complete(request(task="a")))
    assert (first_a.text, second_a.text, first_b.text) == ("a0", "a1", "b0")
    assert first_a.recorded and first_a.provider == "replay" and first_a.cost_usd == 0.0
    served = [json.loads(line) for line in (tmp_path / "run" / "replay_served.jsonl").read_text().splitlines()]
    assert [(s["task"], s["seq"]) for s in served] == [("b", 0), ("a", 1), ("a", 0)]


def test_replay_mismatch_and_exhaustion_are_clear(tmp_path):
    replay = write_replay(tmp_path / "r.jsonl", [{"task": "a", "stage": "optimize", "text": "x"}])
    provider = provider_from_spec(f"replay:{replay}")
    with pytest.raises(ProviderError, match="recorded for stage 'optimize'"):
        asyncio.run(provider.complete(request(task="a")))
    with pytest.raises(ProviderError, match="holds 1 replies for task 'a'"):
        asyncio.run(provider.complete(request(seq=1, task="a")))


def test_replay_by_request_hash(tmp_path):
    rid = request_sha256(request(seq=5, task="z"), "replay")
    replay = write_replay(tmp_path / "r.jsonl", [{"request_sha256": rid, "text": "exact"}])
    assert asyncio.run(provider_from_spec(f"replay:{replay}").complete(request(seq=5, task="z"))).text == "exact"


def test_replay_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        provider_from_spec(f"replay:{tmp_path / 'missing.jsonl'}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "a"}\n')
    with pytest.raises(ConfigError, match="line 1: no 'text'"):
        provider_from_spec(f"replay:{bad}")


def test_unknown_provider_is_a_config_error():
    with pytest.raises(ConfigError, match="does not name a provider"):
        provider_from_spec("claude-sonnet-4-5")
    with pytest.raises(ConfigError, match="needs a model name"):
        provider_from_spec("anthropic:", ProviderSettings(anthropic_api_key="k"))


def test_shipped_replays_are_labelled_recorded():
    for path in sorted((REPO / "examples" / "replays").glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert "not the output of any model" in lines[0]["about"], path
        assert all("recorded" in line["model"] for line in lines[1:]), path


def test_price_table_longest_prefix_and_override(tmp_path):
    table = load_price_table()
    assert price_usd(table, "gpt-5-mini-2025-08-07", 1_000_000, 0) == pytest.approx(0.25)
    assert price_usd(table, "gpt-5-2025-08-07", 1_000_000, 0) == pytest.approx(1.25)
    assert price_usd(table, "gpt-50", 1000, 1000) is None  # a prefix match needs a "-" boundary
    assert price_usd(table, "claude-sonnet-4-5", None, 10) is None
    override = tmp_path / "prices.json"
    prices = {"gpt-5": {"input": 2, "output": 20}, "my-model": {"input": 1, "output": 1}}
    override.write_text(json.dumps({"models": prices}))
    table = load_price_table(override)
    assert price_usd(table, "gpt-5", 1_000_000, 1_000_000) == pytest.approx(22.0)
    assert price_usd(table, "my-model", 500_000, 500_000) == pytest.approx(1.0)
    override.write_text('{"models": {"x": {"input": "cheap"}}}')
    with pytest.raises(ConfigError, match="'x'"):
        load_price_table(override)
