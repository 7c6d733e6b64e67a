"""A request's headers must arrive in time. uvicorn bounds only the wait between requests (its
keep-alive timer, cancelled by the first byte of the next request), so a client that connects and
sends nothing, or trickles its headers a byte at a time, held a connection, its socket and its
memory for ever: a few thousand such clients exhaust a process's file descriptors without ever
reaching a limiter (nginx's client_header_timeout bounds the same wait, 60 s by default).

The deadline runs from the connection's start, and on a kept-alive connection from the next
request's first byte, to the end of its headers. Past it: a request that had begun is answered 408
(an OpenAI error object, `connection: close`); a connection that sent nothing is closed, as
uvicorn's keep-alive timer closes an idle one. The body has its own deadline (edge/body_timeout.py).
Never while a response is being written (a 408 would cut it): the headers of a request pipelined
behind it are timed from the moment it has been written (edge/http_protocol.py).
"""

from __future__ import annotations

import asyncio

from edge.closing_refusal import ClosingRefusal
from edge.cors import CrossOrigins


def timeout_response(timeout_s: float) -> ClosingRefusal:
    """The 408, written straight to the transport (no request reached the app)."""
    return ClosingRefusal(
        b"408 Request Timeout",
        f"The request headers did not arrive within {timeout_s:g} s.",
        "request_timeout",
    )


class HeaderDeadline:
    """One connection's deadline for its current request's headers."""

    __slots__ = (
        "_cross_origins",
        "_handle",
        "_loop",
        "_response",
        "_timeout_s",
        "_transport",
        "origin",
        "request_begun",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        timeout_s: float,
        response: ClosingRefusal,
        cross_origins: CrossOrigins,
    ) -> None:
        self._loop = loop
        self._transport = transport
        self._timeout_s = timeout_s
        self._response = response
        self._cross_origins = cross_origins
        self._handle: asyncio.TimerHandle | None = None
        self.request_begun = False
        # The current request's Origin as far as its head was read (the protocol sets it): every
        # answer the protocol writes itself, the 408 here too, carries the CORS headers for it
        # (`answer`). Kept here rather than on the protocol with a callback to it: the protocol
        # holds this deadline, and a deadline holding the protocol back made every connection a
        # reference cycle, its requests freed only by the collector (tests/edge/test_request_garbage.py).
        self.origin: bytes | None = None

    def answer(self, kind: ClosingRefusal) -> bytes:
        """`kind`'s answer, with the CORS headers for the Origin the request's head came with."""
        return kind.answer(self._cross_origins.refusal_lines(self.origin))

    def start(self, *, request_begun: bool) -> None:
        """From now, unless already running (the connection's start runs it until the first request)."""
        self.request_begun = request_begun
        if self._handle is None:
            self._handle = self._loop.call_later(self._timeout_s, self._expired)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expired(self) -> None:
        self._handle = None
        if self._transport.is_closing():
            return
        if self.request_begun:
            self._transport.write(self.answer(self._response))
        self._transport.close()
