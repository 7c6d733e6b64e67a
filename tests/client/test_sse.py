"""The SSE parser on real edge-shaped byte streams, split at every position."""

from __future__ import annotations

import pytest

from floodgate_client.sse import ServerSentEvent, SSEParser, iter_events

STREAM = (
    b": keep-alive\n\n"
    b'data: {"id":"r1","choices":[{"delta":{"content":"h\xc3\xa9llo"}}]}\n\n'
    b": keep-alive\r\n\r\n"
    b"event: note\r\nid: 7\r\ndata: line one\r\ndata: line two\r\n\r\n"
    b"data:no-space\rdata:  two-spaces\r\r"
    b"retry: 1500\nid\ndata\n\n"
    b"data: \xe2\x9c\x93 ok\n\n"
    b"data: [DONE]\n\n"
)

EXPECTED = [
    ServerSentEvent(data='{"id":"r1","choices":[{"delta":{"content":"héllo"}}]}'),
    ServerSentEvent(data="line one\nline two", event="note", id="7"),
    ServerSentEvent(data="no-space\n two-spaces", id="7"),
    # A bare `id` resets the last id to ""; a bare `data` is one empty data line.
    ServerSentEvent(data="", id="", retry_ms=1500),
    ServerSentEvent(data="✓ ok", id="", retry_ms=1500),
    ServerSentEvent(data="[DONE]", id="", retry_ms=1500),
]


def parse_in_pieces(pieces: list[bytes]) -> list[ServerSentEvent]:
    parser = SSEParser()
    events: list[ServerSentEvent] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    events.extend(parser.close())
    return events


def test_whole_stream_parses_to_the_expected_events() -> None:
    assert parse_in_pieces([STREAM]) == EXPECTED
    assert EXPECTED[-1].is_done and not EXPECTED[0].is_done


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_every_single_split_position_gives_the_same_events(cut: int) -> None:
    assert parse_in_pieces([STREAM[:cut], STREAM[cut:]]) == EXPECTED


def test_byte_at_a_time_gives_the_same_events() -> None:
    assert parse_in_pieces([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_every_pair_of_split_positions_gives_the_same_events() -> None:
    n = len(STREAM)
    for first in range(0, n + 1, 3):
        for second in range(first, n + 1, 5):
            pieces = [STREAM[:first], STREAM[first:second], STREAM[second:]]
            assert parse_in_pieces(pieces) == EXPECTED, (first, second)


def test_keep_alive_comments_alone_yield_nothing() -> None:
    assert parse_in_pieces([b": keep-alive\n\n" * 5, b":\n", b"\n"]) == []


def test_a_crlf_split_between_cr_and_lf_is_one_line_ending() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\r") == []
    assert parser.feed(b"\ndata: b\n\n") == [ServerSentEvent(data="a"), ServerSentEvent(data="b")]


def test_a_leading_byte_order_mark_is_dropped_even_when_split() -> None:
    assert parse_in_pieces([b"\xef", b"\xbb", b"\xbfdata: x\n\n"]) == [ServerSentEvent(data="x")]


def test_an_unterminated_event_at_the_end_is_not_dispatched() -> None:
    assert list(iter_events([b"data: complete\n\n", b"data: cut off"])) == [ServerSentEvent(data="complete")]


def test_a_lone_cr_at_the_very_end_still_ends_its_line() -> None:
    assert list(iter_events([b"data: x\r\r"])) == [ServerSentEvent(data="x")]


def test_unknown_fields_and_bad_retry_are_ignored() -> None:
    events = parse_in_pieces([b"foo: bar\nretry: 12a\ndata: y\n\n"])
    assert events == [ServerSentEvent(data="y")]
