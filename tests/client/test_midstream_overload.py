"""A request refused in the edge's queue after its stream opened gets the overload as an error event:
the client raises it as the RateLimitError it would have been as a 429, and auto_retry waits it out.

A scripted loopback server sends the edge's own encodings (edge/sse.py, edge/errors.py): an edge
cannot be made to refuse a queued request at a chosen moment."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from edge.admission.ticket import Overloaded
from edge.errors import ApiError, in_stream, limiter_unavailable, overloaded_error, shutting_down_error
from edge.sse import DONE, ChunkEncoder, event
from floodgate_client import (
    AsyncClient,
    Client,
    RateLimitError,
    RequestStarted,
    ServiceUnavailableError,
    StreamError,
)
from floodgate_client.retry import retryable
from tests.client.scripted_edge import ScriptedEdge

WAIT_S = 0.2


def overloaded(request_id: str) -> bytes:
    error = overloaded_error(Overloaded("wait_too_long", WAIT_S))
    start = ChunkEncoder(request_id, "floodgate-tiny", 0).first()
    return start + b": keep-alive\n\n" + event({"error": error.detail}) + DONE


def answered(request_id: str) -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return encoder.first() + encoder.delta("hello") + encoder.final("stop", None) + encoder.usage(3, 1) + DONE


@pytest.fixture
def edge() -> Iterator[ScriptedEdge]:
    scripted = ScriptedEdge([overloaded("chatcmpl-first"), answered("chatcmpl-second")])
    yield scripted
    scripted.close()


def test_an_overload_in_the_stream_raises_rate_limit_error_with_its_wait(edge: ScriptedEdge) -> None:
    with Client(edge.base_url, "fg-test") as client, pytest.raises(RateLimitError) as raised:
        client.chat.create("hi", model="floodgate-tiny")
    assert raised.value.limit == "wait_too_long"
    assert raised.value.retry_after_s == pytest.approx(WAIT_S)
    # As the 429 it would have been before the stream opened: code that checks the status, or logs
    # the request id for support, sees the same.
    assert (raised.value.status_code, raised.value.request_id) == (429, "chatcmpl-first")
    assert edge.requests == 1


def test_auto_retry_waits_out_an_overload_in_the_stream_and_reopens(edge: ScriptedEdge) -> None:
    with Client(edge.base_url, "fg-test") as client:
        with client.chat.stream("hi", model="floodgate-tiny", auto_retry=True) as stream:
            events = list(stream)
    assert stream.text == "hello" and edge.requests == 2
    assert [e.request_id for e in events if isinstance(e, RequestStarted)] == [
        "chatcmpl-first",
        "chatcmpl-second",
    ]


def test_async_auto_retry_waits_out_an_overload_in_the_stream(edge: ScriptedEdge) -> None:
    async def main() -> str:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            return (await client.chat.create("hi", model="floodgate-tiny", auto_retry=True)).text

    assert anyio.run(main) == "hello" and edge.requests == 2


# The edge's 429 for a full queue, as a whole response.
QUEUE_FULL_429 = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after-ms: 200\r\n"
    b"content-length: 71\r\nconnection: close\r\n\r\n"
    b'{"error":{"message":"queue full","type":"rate_limit_error","code":"q"}}'
)


def test_max_retries_bounds_the_whole_request_whichever_way_it_is_refused() -> None:
    """A refusal in the stream, then 429s: the reopened attempt once started its own count (and
    clock), so max_retries 2 sent 4 requests here, and up to (1 + N)^2 in general."""

    def sync(base_url: str) -> None:
        with Client(base_url, "fg-test", max_retries=2) as client:
            client.chat.create("hi", model="floodgate-tiny", auto_retry=True)

    async def async_(base_url: str) -> None:
        async with AsyncClient(base_url, "fg-test", max_retries=2) as client:
            await client.chat.create("hi", model="floodgate-tiny", auto_retry=True)

    for create in (sync, lambda base_url: anyio.run(async_, base_url)):
        edge = ScriptedEdge([overloaded("chatcmpl-first"), QUEUE_FULL_429])
        try:
            with pytest.raises(RateLimitError):
                create(edge.base_url)
            assert edge.requests == 3
        finally:
            edge.close()


def drained(request_id: str) -> bytes:
    """A queued stream the edge's drain cut before its first text (edge/generation.py: "drained"):
    answered with the error alone, costing nothing and storing no turn, as the 503 a new request
    to that instance gets."""
    start = ChunkEncoder(request_id, "floodgate-tiny", 0).first()
    return start + event({"error": shutting_down_error().detail}) + DONE


def test_auto_retry_sends_a_stream_the_drain_cut_before_its_text_again() -> None:
    """It raised StreamError: auto_retry retried the drain's 503 before the stream opened, but not
    the same refusal in the stream, which asks for a retry ("another instance will take it")."""

    async def async_create(base_url: str) -> str:
        async with AsyncClient(base_url, "fg-test") as client:
            return (await client.chat.create("hi", model="floodgate-tiny", auto_retry=True)).text

    def sync_create(base_url: str) -> str:
        with Client(base_url, "fg-test") as client:
            return client.chat.create("hi", model="floodgate-tiny", auto_retry=True).text

    for create in (sync_create, lambda base_url: anyio.run(async_create, base_url)):
        edge = ScriptedEdge([drained("chatcmpl-first"), answered("chatcmpl-second")])
        try:
            assert create(edge.base_url) == "hello"
            assert edge.requests == 2
        finally:
            edge.close()
    # Without auto_retry it is the 503 it would have been before the stream opened.
    edge = ScriptedEdge([drained("chatcmpl-first")])
    try:
        with Client(edge.base_url, "fg-test") as client, pytest.raises(ServiceUnavailableError) as raised:
            client.chat.create("hi", model="floodgate-tiny")
        assert (raised.value.status_code, raised.value.code) == (503, "server_shutting_down")
    finally:
        edge.close()


def cut_after_text(request_id: str, error: ApiError) -> bytes:
    """A stream whose text had begun when the drain cut it, or its limiter store went away: the
    edge's error event after the text, its usage and [DONE] (edge/generation.py)."""
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return (
        encoder.first()
        + encoder.delta("hel")
        + encoder.usage(3, 1)
        + event({"error": in_stream(error)})
        + DONE
    )


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    "error", [shutting_down_error(), limiter_unavailable(WAIT_S)], ids=lambda e: e.detail.code
)
def test_an_overload_after_text_is_a_stream_error_without_a_status(kind: str, error: ApiError) -> None:
    """A review: after text it was raised as the ServiceUnavailableError, status 503, it is before
    any: a caller's own retry of a 503 sent the request again and showed the text that came a second
    time. As an upstream_error after text (README): a StreamError, no status, never sent again; the
    code and the edge's wait stay on it for a caller that decides to."""
    edge = ScriptedEdge([cut_after_text("chatcmpl-first", error), answered("chatcmpl-second")])
    try:
        if kind == "sync":
            with Client(edge.base_url, "fg-test") as client, pytest.raises(StreamError) as raised:
                client.chat.create("hi", model="floodgate-tiny", auto_retry=True)
        else:

            async def main() -> None:
                async with AsyncClient(edge.base_url, "fg-test") as client:
                    await client.chat.create("hi", model="floodgate-tiny", auto_retry=True)

            with pytest.raises(StreamError) as raised:
                anyio.run(main)
        assert edge.requests == 1
    finally:
        edge.close()
    got = raised.value
    assert (got.status_code, got.code, got.request_id) == (None, error.detail.code, "chatcmpl-first")
    assert got.retry_after_s == pytest.approx(int(error.headers["retry-after-ms"]) / 1000)
    assert not retryable(got)
    assert got.usage is not None and got.usage.completion_tokens == 1
