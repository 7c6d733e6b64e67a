"""edge/body_chunks.py: a token's chunk goes straight to the transport only when uvicorn's send
would have written it at once; otherwise the caller awaits the send."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from edge.body_chunks import BodyChunkWriter
from edge.writes_together import writes_together


class _Cycle(SimpleNamespace):
    """uvicorn's RequestResponseCycle, as far as the writer reads it (and weakly referable)."""


def _cycle(**state: Any) -> Any:
    written: list[bytes] = []
    cycle = _Cycle(
        raw=[],
        flow=SimpleNamespace(write_paused=False),
        disconnected=False,
        response_complete=False,
        response_started=True,
        chunked_encoding=True,
        transport=SimpleNamespace(write=written.append),
        written=written,
    )
    for name, value in state.items():
        if name == "write_paused":
            cycle.flow.write_paused = value
        else:
            setattr(cycle, name, value)
    return cycle


def _writer(cycle: Any) -> BodyChunkWriter:
    return BodyChunkWriter(cycle, cycle.raw.append)


def test_a_chunk_is_framed_and_written_at_once() -> None:
    cycle = _cycle()
    assert _writer(cycle).write_now(b"data: x\n\n")
    assert cycle.written == [b"9\r\ndata: x\n\n\r\n"]


@pytest.mark.parametrize(
    "state",
    [
        {"write_paused": True},  # a slow reader: the send waits, and the stall watch sees it
        {"disconnected": True},
        {"response_complete": True},
        {"response_started": False},
        {"chunked_encoding": False},
    ],
)
def test_anything_that_would_make_the_send_wait_or_refuse_is_left_to_it(state: dict[str, bool]) -> None:
    cycle = _cycle(**state)
    assert not _writer(cycle).write_now(b"data: x\n\n")
    assert cycle.written == []


def test_an_empty_chunk_is_never_written_as_the_end_of_the_body() -> None:
    cycle = _cycle()
    assert not _writer(cycle).write_now(b"")
    assert cycle.written == []


def test_only_the_first_chunk_passes_the_head_holding_transport() -> None:
    """The first body bytes carry a held head (edge/header_write.py); after them none is held, so
    the rest of the response's chunks go to the socket's own transport."""
    cycle = _cycle()
    write_now = _writer(cycle).write_now
    assert write_now(b"data: a\n\n") and write_now(b"data: b\n\n") and write_now(b"data: c\n\n")
    assert cycle.written == [b"9\r\ndata: a\n\n\r\n"]
    assert cycle.raw == [b"9\r\ndata: b\n\n\r\n", b"9\r\ndata: c\n\n\r\n"]


def test_inside_a_delivery_a_chunk_is_accepted_at_once_and_written_with_the_others() -> None:
    """The caller learns at once that the chunk is taken (it must not also await the send); the
    bytes go out when the delivery's relays are done, the first through the head-holding transport."""
    cycle = _cycle()
    write_now = _writer(cycle).write_now
    taken: list[bool] = []

    def deliver(_streams: object) -> None:
        taken.append(write_now(b"data: a\n\n"))
        taken.append(write_now(b"data: b\n\n"))
        assert cycle.written == [] and cycle.raw == []

    writes_together(deliver, ["stream", "another stream"])
    assert taken == [True, True]
    assert cycle.written == [b"9\r\ndata: a\n\n\r\n"]
    assert cycle.raw == [b"9\r\ndata: b\n\n\r\n"]


def test_to_an_http_1_0_client_a_chunk_is_written_unframed() -> None:
    """HTTP/1.0 has no chunked coding: its stream is delimited by the close (edge/http_protocol.py),
    and a token's bytes take this short path all the same, as they are."""
    cycle = _cycle(chunked_encoding=False, until_close=True)
    write_now = _writer(cycle).write_now
    assert write_now(b"data: a\n\n") and write_now(b"data: b\n\n")
    assert cycle.written == [b"data: a\n\n"] and cycle.raw == [b"data: b\n\n"]
