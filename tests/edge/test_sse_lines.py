"""Every event the stream encoder writes is one line to every line reader, whatever the reply's text:
httpx's `aiter_lines` (the usual hand-written Python reader, which splits where `str.splitlines`
does) as well as the openai SDK's SSE decoder. The overload drill's httpx client met a reply
carrying U+2028 that arrived as two broken lines."""

from __future__ import annotations

import json

import pytest
from httpx._decoders import LineDecoder
from openai._streaming import SSEDecoder

from edge.sse import ChunkEncoder, event

# Each is a line break to str.splitlines, none is one to SSE or needs escaping in JSON.
TEXTS = ["a\u2028b", "a\u2029b", "a\x85b", "\u2028\u2029\x85", "é\u2028ü and 漢字\x85"]


def _lines(stream: bytes) -> list[str]:
    decoder = LineDecoder()
    return [*decoder.decode(stream.decode()), *decoder.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_a_delta_is_one_line_and_reads_back_as_its_text(text: str) -> None:
    encoder = ChunkEncoder("chatcmpl-1", "m", 0)
    stream = encoder.first() + encoder.delta(text) + encoder.final("stop", None)

    data = [line for line in _lines(stream) if line]
    events = [sse.data for sse in SSEDecoder().iter_bytes(iter([stream]))]

    assert len(data) == 3 and all(line.startswith("data: {") for line in data)
    assert json.loads(data[1].removeprefix("data: "))["choices"][0]["delta"]["content"] == text
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == text


def test_any_event_is_one_line() -> None:
    payload = {"error": {"message": "x\u2028y", "code": None}}
    (line, blank, *_) = _lines(event(payload))
    assert json.loads(line.removeprefix("data: ")) == payload and blank == ""


def test_ascii_text_is_sent_as_msgspec_encodes_it() -> None:
    encoder = ChunkEncoder("chatcmpl-1", "m", 0)
    assert encoder.delta('say "hi"\n').endswith(b'"say \\"hi\\"\\n"},"finish_reason":null}]}\n\n')
