"""edge/header_write.py: a response head leaves with the first body bytes, never later than the
loop's next pass, and before the connection closes."""

from __future__ import annotations

import asyncio
from typing import Any

from edge.header_write import HeadHoldingTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"


class FakeTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", None))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _wrapped() -> tuple[FakeTransport, HeadHoldingTransport, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    raw = FakeTransport()
    return raw, HeadHoldingTransport(raw, loop), loop  # type: ignore[arg-type]


def test_head_and_first_body_bytes_are_one_write() -> None:
    raw, transport, loop = _wrapped()
    transport.write(HEAD)
    assert raw.calls == []
    assert transport.get_write_buffer_size() == len(HEAD)
    transport.write(b"5\r\nhello\r\n")
    transport.write(b"3\r\nbye\r\n")
    assert raw.calls == [("write", HEAD + b"5\r\nhello\r\n"), ("write", b"3\r\nbye\r\n")]
    loop.run_until_complete(asyncio.sleep(0))  # the scheduled flush finds nothing left
    assert len(raw.calls) == 2
    loop.close()


def test_a_head_alone_goes_out_by_the_loops_next_pass() -> None:
    raw, transport, loop = _wrapped()
    transport.write(HEAD)

    async def two_passes() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    loop.run_until_complete(two_passes())
    assert raw.calls == [("write", HEAD)]
    loop.close()


def test_a_first_event_written_by_a_task_created_with_the_head_leaves_with_it() -> None:
    """edge/streaming.py's order: the response start is sent, then the generation runs in a task
    of its own, whose first step (the first event) comes in the loop's next pass."""
    raw, transport, loop = _wrapped()

    async def first_event() -> None:
        transport.write(b"5\r\nhello\r\n")

    async def respond() -> None:
        transport.write(HEAD)
        await loop.create_task(first_event())
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    loop.run_until_complete(respond())
    assert raw.calls == [("write", HEAD + b"5\r\nhello\r\n")]
    loop.close()


def test_close_writes_the_held_head_first_and_abort_drops_it() -> None:
    raw, transport, loop = _wrapped()
    transport.write(HEAD)
    transport.close()
    assert raw.calls == [("write", HEAD), ("close", None)]
    raw2, transport2, loop2 = _wrapped()
    transport2.write(HEAD)
    transport2.abort()
    loop2.run_until_complete(asyncio.sleep(0))
    assert raw2.calls == [("abort", None)]
    loop.close()
    loop2.close()


def test_body_bytes_pass_straight_through_and_the_rest_is_the_transports() -> None:
    raw, transport, loop = _wrapped()
    transport.write(b"5\r\nhello\r\n")
    assert raw.calls == [("write", b"5\r\nhello\r\n")]
    assert transport.get_extra_info("peername") == "info:peername"
    loop.close()
