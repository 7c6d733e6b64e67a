"""A response's status line and headers leave in the same write(2) as its first body bytes.

uvicorn writes the headers the moment the app sends `http.response.start`, and the first body
chunk in a second write. Every response here sends its first body bytes right after the start, in
the same pass of the event loop (an SSE stream's first event carries the request id; a JSON answer
is one body), so the headers are held until that next write and go out with it: one write(2) and
one wake-up of the client instead of two. (On loopback a write's wall time is mostly the client
running in the server's place; its CPU is a few per cent of a stream's set-up, docs/bench-streams.md.)

The headers never wait past the loop's next pass: a callback scheduled there writes them if nothing
followed (a response whose body is computed after an await). Not this pass's end: an SSE stream
writes its first event from a task of its own (edge/streaming.py), whose first step runs in the
next pass, and a flush at the end of this one sent every stream's head in a write of its own (seen
with strace: head, first event, last event, three writes for a one-token stream). Closing the
connection writes them first. Only what uvicorn writes as a response head (status line through
the blank line) is held; body chunks pass straight through, and a stream's token chunks after its
first body bytes skip this wrapper altogether (edge/body_chunks.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"


class HeadHoldingTransport:
    """The connection's transport, with a response head held until the next write or the loop's
    next pass. Everything else is the wrapped transport's."""

    __slots__ = ("_flush_due", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_due = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(_HEAD_START) and data.endswith(_HEAD_END):
            self._held = data
            if not self._flush_due:
                self._flush_due = True
                self._loop.call_soon(self._flush_next_pass)
        else:
            self._transport.write(data)

    def _flush_next_pass(self) -> None:
        # Callbacks scheduled in this pass (a new task's first step) run before this one.
        self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
