"""Chunk decoding: the edge's chunk shapes become typed events (pure logic, no server needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from floodgate_client.decoder import ChunkDecoder
from floodgate_client.errors import NetworkError, StreamError
from floodgate_client.events import Finished, RequestStarted, TextDelta, Usage
from floodgate_client.sse import ServerSentEvent


def chunk(payload: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(payload))


FIRST = {
    "id": "r1",
    "request_id": "r1",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
}


def delta(text: str) -> dict[str, Any]:
    return {"id": "r1", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def test_a_full_stream_gives_started_deltas_and_finished_with_usage_and_marker() -> None:
    decoder = ChunkDecoder()
    events = []
    for sse in [
        chunk(FIRST),
        chunk(delta("Hel")),
        chunk(delta("lo")),
        chunk(
            {
                "id": "r1",
                "choices": [{"delta": {}, "finish_reason": "length"}],
                "floodgate": {"limit_reached": "tokens"},
            }
        ),
        chunk(
            {
                "id": "r1",
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            }
        ),
        ServerSentEvent(data="[DONE]"),
    ]:
        events.extend(decoder.feed(sse))
    assert events == [
        RequestStarted("r1"),
        TextDelta("Hel"),
        TextDelta("lo"),
        Finished("length", Usage(5, 2, 7), cancelled=False, limit_reached="tokens"),
    ]
    assert decoder.text == "Hello"


def test_an_error_event_mid_stream_raises_stream_error_with_its_fields() -> None:
    decoder = ChunkDecoder()
    decoder.feed(chunk(FIRST))
    error = {"error": {"message": "replica lost", "type": "server_error", "param": None, "code": "upstream"}}
    with pytest.raises(StreamError) as caught:
        decoder.feed(chunk(error))
    assert (caught.value.message, caught.value.type, caught.value.code, caught.value.request_id) == (
        "replica lost",
        "server_error",
        "upstream",
        "r1",
    )


def test_the_usage_sent_before_an_error_comes_with_it() -> None:
    """The edge sends a stream's usage just before its error event: what it was charged."""
    decoder = ChunkDecoder()
    decoder.feed(chunk(FIRST))
    decoder.feed(chunk(delta("Hel")))
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
    assert decoder.feed(chunk({"id": "r1", "choices": [], "usage": usage})) == []
    lost = {"error": {"message": "replica lost", "type": "server_error", "code": "upstream"}}
    with pytest.raises(StreamError) as caught:
        decoder.feed(chunk(lost))
    assert caught.value.usage == Usage(prompt_tokens=9, completion_tokens=1, total_tokens=10)


def test_a_stream_cut_before_its_final_chunk_is_a_network_error() -> None:
    decoder = ChunkDecoder()
    decoder.feed(chunk(FIRST))
    decoder.feed(chunk(delta("partial")))
    with pytest.raises(NetworkError):
        decoder.end_of_stream()


def test_a_cancel_marker_sets_cancelled() -> None:
    decoder = ChunkDecoder()
    decoder.feed(chunk(FIRST))
    decoder.feed(
        chunk(
            {
                "id": "r1",
                "choices": [{"delta": {}, "finish_reason": "stop"}],
                "floodgate": {"cancelled": True},
            }
        )
    )
    assert decoder.end_of_stream() == [Finished("stop", None, cancelled=True, limit_reached=None)]
