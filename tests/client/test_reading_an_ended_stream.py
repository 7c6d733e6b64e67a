"""Reading a stream after it ended: one left by its `with` block (or closed) before its Finished, or
ended by an error, raised nothing on iteration (an empty stream, as if the reply had been nothing) and
an AssertionError from until_finished; sync and async alike. It raises NetworkError ("stream closed"),
as the streams' docstrings say; a stream that finished reads as empty and until_finished gives its
Finished again."""

from __future__ import annotations

import anyio
import pytest

from edge.errors import upstream_error
from edge.sse import DONE, ChunkEncoder, event
from floodgate_client import AsyncClient, Client, Finished, NetworkError, StreamError, TextDelta
from tests.client.live import LONG_REPLY, LONG_REPLY_TOKENS, SURE_TEXT
from tests.client.scripted_edge import ScriptedEdge
from tests.support.live_server import LiveServer


def _failed(request_id: str) -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return encoder.first() + encoder.delta("hel") + event({"error": upstream_error().detail}) + DONE


def test_a_stream_left_before_its_end_raises_when_read_on(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        with client.chat.stream(LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=0.0) as stream:
            next(event for event in stream if isinstance(event, TextDelta))
        with pytest.raises(NetworkError, match="stream closed"):
            next(stream)
        with pytest.raises(NetworkError, match="stream closed"):
            stream.until_finished()


def test_an_async_stream_left_before_its_end_raises_when_read_on(server: LiveServer) -> None:
    async def main() -> None:
        async with AsyncClient(server.base_url, server.keys["paid"]) as client:
            stream = client.chat.stream(LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=0.0)
            async with stream:
                async for event in stream:
                    if isinstance(event, TextDelta):
                        break
            with pytest.raises(NetworkError, match="stream closed"):
                await anext(stream)
            with pytest.raises(NetworkError, match="stream closed"):
                await stream.until_finished()

    anyio.run(main)


def test_a_finished_stream_reads_as_empty_and_gives_its_finished_again(server: LiveServer) -> None:
    async def read_async() -> tuple[list[object], Finished, Finished]:
        async with AsyncClient(server.base_url, server.keys["paid"]) as aclient:
            async with aclient.chat.stream(**SURE_TEXT, max_tokens=4) as astream:
                finished = await astream.until_finished()
            return [e async for e in astream], finished, await astream.until_finished()

    with Client(server.base_url, server.keys["paid"]) as client:
        with client.chat.stream(**SURE_TEXT, max_tokens=4) as stream:
            finished = stream.until_finished()
        assert list(stream) == [] and stream.until_finished() is finished
    rest, afinished, again = anyio.run(read_async)
    assert rest == [] and again is afinished


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stream_ended_by_an_error_raises_again_when_read_on(kind: str) -> None:
    """create() and until_finished() read to the end: after the error event's StreamError a second
    until_finished() (a caller's retry of the read) raised AssertionError."""
    edge = ScriptedEdge([_failed("chatcmpl-failed")])
    caught: list[Exception] = []

    async def read_twice_async() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as aclient:
            astream = await aclient.chat.stream("hi", model="floodgate-tiny")
            for _ in range(2):
                try:
                    await astream.until_finished()
                except Exception as error:  # whichever escapes: the point of the test
                    caught.append(error)
            await astream.close()

    try:
        if kind == "sync":
            with Client(edge.base_url, "fg-test") as client:
                stream = client.chat.stream("hi", model="floodgate-tiny")
                for _ in range(2):
                    try:
                        stream.until_finished()
                    except Exception as error:  # whichever escapes: the point of the test
                        caught.append(error)
                stream.close()
        else:
            anyio.run(read_twice_async)
        first, second = caught
        assert isinstance(first, StreamError), repr(first)
        assert isinstance(second, NetworkError) and "stream closed" in second.message, repr(second)
    finally:
        edge.close()
