"""Streaming against a real edge: events in order, text accumulating, limits, whole replies."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from edge.sse import DONE, ChunkEncoder
from floodgate_client import AsyncClient, ChatResult, Client, Finished, RequestStarted, TextDelta
from tests.client.live import LONG_REPLY, OVERRIDES, SURE_TEXT
from tests.client.scripted_edge import ScriptedEdge
from tests.support.live_server import LiveServer, start_server


def test_a_stream_yields_started_then_deltas_then_finished_and_text_accumulates(server: LiveServer) -> None:
    with (
        Client(server.base_url, server.keys["paid"]) as client,
        client.chat.stream(
            [{"role": "user", "content": LONG_REPLY.prompt}], max_tokens=24, temperature=0.0
        ) as stream,
    ):
        events = list(stream)
        lengths_seen = [len(stream.text)]
    assert isinstance(events[0], RequestStarted)
    assert events[0].request_id == stream.request_id == stream.headers["x-request-id"]
    deltas = [event for event in events if isinstance(event, TextDelta)]
    assert deltas, "the reply had no text"
    assert stream.text == "".join(delta.text for delta in deltas)
    assert lengths_seen == [len(stream.text)]
    finished = events[-1]
    assert isinstance(finished, Finished) and sum(isinstance(e, Finished) for e in events) == 1
    assert finished.reason in ("stop", "length") and not finished.cancelled
    assert finished.usage is not None and 0 < finished.usage.completion_tokens <= 24
    assert finished.usage.total_tokens == finished.usage.prompt_tokens + finished.usage.completion_tokens


def test_text_grows_while_the_stream_is_read(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        stream = client.chat.stream(**SURE_TEXT, max_tokens=16)
        lengths = [len(stream.text) for event in stream if isinstance(event, TextDelta)]
    assert len(lengths) >= 2 and lengths == sorted(lengths) and lengths[0] < lengths[-1]


def test_rate_limits_come_from_the_response_headers(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        stream = client.chat.stream("Hello", max_tokens=4)
        stream.until_finished()
    limits = stream.rate_limits
    assert limits.limit_requests == 100_000
    assert limits.remaining_requests is not None and limits.remaining_requests < 100_000
    assert limits.limit_tokens == 100_000_000
    assert limits.reset_requests_s is not None and limits.reset_tokens_s is not None


def test_create_returns_the_whole_reply(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        result = client.chat.create(**SURE_TEXT, max_tokens=12)
    assert result.text and result.request_id.startswith("chatcmpl-")
    assert result.finish_reason in ("stop", "length")
    assert result.usage is not None and result.usage.completion_tokens <= 12


@pytest.mark.anyio
async def test_async_client_streams_with_the_same_events(server: LiveServer) -> None:
    async with AsyncClient(server.base_url, server.keys["paid"]) as client:
        async with client.chat.stream(**SURE_TEXT, max_tokens=10) as stream:
            events = [event async for event in stream]
    assert isinstance(events[0], RequestStarted) and isinstance(events[-1], Finished)
    assert stream.text == "".join(e.text for e in events if isinstance(e, TextDelta))


@pytest.mark.anyio
async def test_async_client_carries_100_concurrent_streams(server: LiveServer) -> None:
    results: dict[int, ChatResult] = {}

    async def one(client: AsyncClient, i: int) -> None:
        results[i] = await client.chat.create(f"Stream number {i}", max_tokens=6, seed=i)

    async with AsyncClient(server.base_url, server.keys["paid"]) as client:
        async with anyio.create_task_group() as group:
            for i in range(100):
                group.start_soon(one, client, i)
    assert len(results) == 100
    assert len({result.request_id for result in results.values()}) == 100
    assert all(result.finish_reason in ("stop", "length") for result in results.values())
    assert all(
        result.usage is not None and 1 <= result.usage.completion_tokens <= 6 for result in results.values()
    )
    # A random-weight model may end a reply at its first token; across 100 of them, text comes back.
    assert sum(bool(result.text) for result in results.values()) > 50


def test_a_repeated_prompt_reports_its_cached_tokens(server: LiveServer) -> None:
    # Long enough to fill several KV blocks, so the second request meets the first one's blocks.
    system = "You are a careful assistant who answers in one short sentence. " * 8
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]
    with Client(server.base_url, server.keys["paid"]) as client:
        client.chat.create(messages, max_tokens=2, temperature=0.0)
        again = client.chat.create(messages, max_tokens=2, temperature=0.0)
        with client.chat.stream(messages, max_tokens=2, temperature=0.0) as stream:
            finished = stream.until_finished()
    assert again.usage is not None and 0 < again.usage.cached_tokens < again.usage.prompt_tokens
    assert finished.usage is not None and finished.usage.cached_tokens == again.usage.cached_tokens


def test_create_says_when_the_token_budget_or_a_cancel_cut_the_reply(tmp_path: Path) -> None:
    """The edge marks a reply its user's token budget cut ("limit_reached": "tokens", finish_reason
    "length") and one a cancel stopped ("cancelled", finish_reason "stop"); Finished carries both,
    but create()'s ChatResult dropped them: a reply the budget cut read as one max_tokens ended,
    and a cancelled one, its text cut short, as a whole reply."""
    # A budget each for the sync and the async client's user: the first reply spends its whole.
    budget = {"tokens_per_window": 80, "token_window_s": 86400}
    tiers = {tier: settings | budget for tier, settings in OVERRIDES["tiers"].items()}
    with start_server(tmp_path, {"tiers": tiers}) as server:
        with Client(server.base_url, server.keys["paid"]) as client:
            cut = client.chat.create(LONG_REPLY.prompt, temperature=0.0)

        async def create_async() -> ChatResult:
            async with AsyncClient(server.base_url, server.keys["free"]) as client:
                return await client.chat.create(LONG_REPLY.prompt, temperature=0.0)

        cut_async = anyio.run(create_async)
    for result in (cut, cut_async):
        assert result.text and result.finish_reason == "length", result
        assert result.limit_reached == "tokens" and not result.cancelled, result

    encoder = ChunkEncoder("chatcmpl-cancelled", "floodgate-tiny", 0)
    stopped = encoder.first() + encoder.delta("hel") + encoder.final("stop", {"cancelled": True}) + DONE
    edge = ScriptedEdge([stopped])
    try:
        with Client(edge.base_url, "fg-test") as client:
            cancelled = client.chat.create("hi", model="floodgate-tiny")
    finally:
        edge.close()
    assert cancelled.text == "hel" and cancelled.cancelled and cancelled.limit_reached is None, cancelled
