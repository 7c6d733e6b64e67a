"""A streamed token's chunk written straight to the connection when nothing makes it wait.

Every token of a stream went through the ASGI send: a coroutine, Litestar's exception
middleware's `capture_response_started` wrapper, and uvicorn's `send` (its flow-control,
disconnect, response-state and framing checks, a list and a join), about 13 % of a token's CPU at
a real pace under cProfile (docs/bench-streams.md). Here the edge's uvicorn protocol
(edge/http_protocol.py) puts a plain function in the request's scope that frames the chunk and
hands it to the transport in one call, when and only when uvicorn's `send` would have done just
that without waiting: the response is started, chunked and not complete, the connection is up,
and writing is not paused. Otherwise it answers False and the caller awaits the ordinary send,
which waits for a slow reader (the stalled-reader watch, edge/stalled_readers.py, sees that
wait), drops writes to a gone client, or raises as before. The last write of a stream, which
completes the response, always goes through `send`.
"""

from __future__ import annotations

from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

# The scope key under which the protocol leaves the writer (absent under other servers and tests).
WRITE_NOW = "floodgate.write_now"

WriteNow = Callable[[bytes], bool]


class BodyChunkWriter:
    __slots__ = ("_cycle",)

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle

    def write_now(self, body: bytes) -> bool:
        """Write `body` as one chunk of the started response now; False (nothing written) when the
        ordinary send must decide."""
        cycle = self._cycle
        if (
            not body  # an empty chunk would end a chunked body
            or cycle.flow.write_paused
            or cycle.disconnected
            or cycle.response_complete
            or not cycle.response_started
            or not cycle.chunked_encoding
        ):
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True
