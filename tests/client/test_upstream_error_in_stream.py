"""A replica that fails once a stream is open ends it with an `upstream_error` event, which now
carries the retry hint its 502 carries as headers (`retry_after_ms`, `should_retry`). Before any
text the edge refunded the request and stored nothing, as for that 502: auto_retry waits out the
hint and reopens it, unless the edge says not to. After text it is never reopened (the text cannot
be taken back): the StreamError it raises carries the hint for the caller, where it carried none.

A scripted loopback server sends the edge's own encodings (edge/sse.py, edge/errors.py): a real
edge's replica cannot be made to fail at a chosen moment from here (tests/faults does that)."""

from __future__ import annotations

import anyio
import pytest

from edge.errors import ApiError, in_stream, upstream_error
from edge.sse import DONE, ChunkEncoder, event
from floodgate_client import AsyncClient, Client, StreamError
from tests.client.scripted_edge import ScriptedEdge

WAIT_S = 0.2
RESTARTING = upstream_error(WAIT_S)
FINAL = upstream_error(None, final=True)


def failed(request_id: str, error: ApiError, text: str = "") -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    sent = encoder.delta(text) if text else b""
    return (
        encoder.first()
        + sent
        + encoder.usage(3, 1 if text else 0)
        + event({"error": in_stream(error)})
        + DONE
    )


def answered(request_id: str) -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return encoder.first() + encoder.delta("hello") + encoder.final("stop", None) + encoder.usage(3, 1) + DONE


def create(kind: str, base_url: str, auto_retry: bool = True) -> str:
    if kind == "sync":
        with Client(base_url, "fg-test") as client:
            return client.chat.create("hi", model="floodgate-tiny", auto_retry=auto_retry).text

    async def main() -> str:
        async with AsyncClient(base_url, "fg-test") as client:
            return (await client.chat.create("hi", model="floodgate-tiny", auto_retry=auto_retry)).text

    return anyio.run(main)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_replica_failing_before_any_text_is_waited_out_and_reopened(kind: str) -> None:
    edge = ScriptedEdge([failed("chatcmpl-first", RESTARTING), answered("chatcmpl-second")])
    try:
        assert create(kind, edge.base_url) == "hello"
        assert edge.requests == 2
    finally:
        edge.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_replica_failing_before_any_text_raises_its_502_with_its_hint(kind: str) -> None:
    """Without auto_retry, or where the edge says not to send it again (the request may be what
    killed its replica), it raises once, as the 502 it would have been, the hint on it."""
    for error, auto_retry, wait_s, should_retry in (
        (RESTARTING, False, WAIT_S, None),
        (FINAL, True, None, False),
    ):
        edge = ScriptedEdge([failed("chatcmpl-first", error), answered("chatcmpl-second")])
        try:
            with pytest.raises(StreamError) as raised:
                create(kind, edge.base_url, auto_retry=auto_retry)
            assert edge.requests == 1
        finally:
            edge.close()
        got = raised.value
        assert (got.status_code, got.code, got.request_id) == (502, "upstream_error", "chatcmpl-first")
        assert got.retry_after_s == (None if wait_s is None else pytest.approx(wait_s))
        assert got.should_retry is should_retry


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_replica_failing_after_text_is_never_reopened_and_its_error_carries_the_hint(kind: str) -> None:
    for error, wait_s, should_retry in ((RESTARTING, WAIT_S, None), (FINAL, None, False)):
        edge = ScriptedEdge([failed("chatcmpl-first", error, "hel"), answered("chatcmpl-second")])
        try:
            with pytest.raises(StreamError) as raised:
                create(kind, edge.base_url)
            assert edge.requests == 1  # the reply is not started over behind the caller's back
        finally:
            edge.close()
        got = raised.value
        # No status: not the 502 a retry would meet, a stream that sent text and then failed.
        assert (got.status_code, got.code, got.request_id) == (None, "upstream_error", "chatcmpl-first")
        assert got.retry_after_s == (None if wait_s is None else pytest.approx(wait_s))
        assert got.should_retry is should_retry
        assert got.usage is not None and got.usage.completion_tokens == 1


def cancel_after_the_error(kind: str, base_url: str) -> bool:
    """Read a stream (not retried) up to its error, then cancel it: what cancel() answers."""
    if kind == "sync":
        with (
            Client(base_url, "fg-test") as client,
            client.chat.stream("hi", model="floodgate-tiny") as stream,
        ):
            with pytest.raises(StreamError):
                stream.until_finished()
            return stream.cancel()

    async def main() -> bool:
        async with (
            AsyncClient(base_url, "fg-test") as client,
            client.chat.stream("hi", model="floodgate-tiny") as stream,
        ):
            with pytest.raises(StreamError):
                await stream.until_finished()
            return await stream.cancel()

    return anyio.run(main)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cancelling_a_stream_its_502_ended_cancels_nothing(kind: str) -> None:
    """Raised before any text and not retried, the request is over on the server: there is nothing
    to cancel, and no retry to call off, so cancel() says False, as it says of a reply that had
    finished. It said True (the refusal's branch: a retry called off) once such an error counted
    as refused."""
    edge = ScriptedEdge([failed("chatcmpl-first", RESTARTING)])
    try:
        assert cancel_after_the_error(kind, edge.base_url) is False
        assert edge.requests == 1 and edge.cancels == 0
    finally:
        edge.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    "wait",
    [
        *(
            b'"retry_after_ms":' + ms
            for ms in (b"1e400", b"Infinity", b"-Infinity", b"NaN", b"1" + b"0" * 400)
        ),
        b'"retry_after_s":1e308',
    ],
)
def test_a_wait_no_number_can_hold_is_no_hint(kind: str, wait: bytes) -> None:
    """A review: Python's json reads 1e400 (and Infinity) as an infinity, which round() refused
    with an OverflowError (NaN: a ValueError, an integer of 401 digits or 1e308 s in ms: an
    OverflowError), raised from the stream instead of the StreamError: `except FloodgateError`
    missed it. Such a wait is no hint; the error is raised as any other, before text and after."""
    sent = f'"retry_after_ms":{round(WAIT_S * 1000)}'.encode()
    for text, status in (("", 502), ("hel", None)):
        script = failed("chatcmpl-first", RESTARTING, text)
        assert sent in script
        edge = ScriptedEdge([script.replace(sent, wait)])
        try:
            with pytest.raises(StreamError) as raised:
                create(kind, edge.base_url, auto_retry=False)
            assert edge.requests == 1
        finally:
            edge.close()
        got = raised.value
        assert (got.status_code, got.code, got.retry_after_s) == (status, "upstream_error", None)
