"""edge/body_chunks.py: a token's chunk goes straight to the transport only when uvicorn's send
would have written it at once; otherwise the caller awaits the send."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from edge.body_chunks import BodyChunkWriter


def _cycle(**state: Any) -> Any:
    written: list[bytes] = []
    cycle = SimpleNamespace(
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


def test_a_chunk_is_framed_and_written_at_once() -> None:
    cycle = _cycle()
    assert BodyChunkWriter(cycle).write_now(b"data: x\n\n")
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
    assert not BodyChunkWriter(cycle).write_now(b"data: x\n\n")
    assert cycle.written == []


def test_an_empty_chunk_is_never_written_as_the_end_of_the_body() -> None:
    cycle = _cycle()
    assert not BodyChunkWriter(cycle).write_now(b"")
    assert cycle.written == []
