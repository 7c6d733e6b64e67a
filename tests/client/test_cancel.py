"""Cancelling: the server stops the generation and says so, from the stream, the side, or a `with` exit."""

from __future__ import annotations

import pytest

from client import AsyncClient, Client, ConflictError, Finished, TextDelta
from client.client import ChatStream
from tests.client.live import LONG_REPLY_TOKENS, long_prompt
from tests.support.live_server import LiveServer


def streaming_reply(client: Client) -> ChatStream:
    """A stream that has produced text and is still generating (retrying seeds that end early)."""
    for seed in range(5):
        stream = client.chat.stream(long_prompt(seed), max_tokens=LONG_REPLY_TOKENS, seed=seed)
        for event in stream:
            if isinstance(event, TextDelta):
                return stream
        stream.close()
    raise AssertionError("no seed gave a reply that was still running after its first token")


def test_cancel_is_confirmed_and_the_stream_ends_cancelled(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        stream = streaming_reply(client)
        assert stream.cancel() is True
        rest = list(stream)
        assert rest == [Finished("stop", None, cancelled=True, limit_reached=None)]
        assert stream.finished is not None and stream.finished.cancelled
        assert stream.request_id is not None
        # The server has really stopped it: cancelling again finds it finished.
        with pytest.raises(ConflictError):
            client.chat.cancel(stream.request_id)


def test_a_cancel_from_the_side_ends_the_stream_with_the_servers_cancelled_marker(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        stream = streaming_reply(client)
        assert stream.request_id is not None
        assert client.chat.cancel(stream.request_id) == "CANCELLED"
        finished = stream.until_finished()
    # This Finished is the edge's own final chunk (the stream was read to its [DONE]).
    assert finished.cancelled and finished.reason == "stop"
    assert finished.usage is not None and finished.usage.completion_tokens < LONG_REPLY_TOKENS


def test_leaving_the_with_block_early_cancels_on_the_server(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        with streaming_reply(client) as stream:
            request_id = stream.request_id
            text_at_exit = stream.text
        assert request_id is not None and text_at_exit
        with pytest.raises(ConflictError):
            client.chat.cancel(request_id)


@pytest.mark.anyio
async def test_async_with_exit_cancels_and_async_cancel_is_confirmed(server: LiveServer) -> None:
    async with AsyncClient(server.base_url, server.keys["paid"]) as client:
        async with client.chat.stream(long_prompt(0), max_tokens=LONG_REPLY_TOKENS, seed=0) as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    break
            request_id = stream.request_id
        assert request_id is not None
        with pytest.raises(ConflictError):
            await client.chat.cancel(request_id)

        stream = await client.chat.stream(long_prompt(1), max_tokens=LONG_REPLY_TOKENS, seed=1)
        async for event in stream:
            if isinstance(event, TextDelta):
                break
        assert await stream.cancel() is True
        assert [event async for event in stream] == [Finished("stop", None, cancelled=True)]
