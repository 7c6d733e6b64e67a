"""A streamed token's chunk written straight to the connection when nothing makes it wait.

Every token of a stream went through the ASGI send: a coroutine, Litestar's exception
middleware's `capture_response_started` wrapper, and uvicorn's `send` (its flow-control,
disconnect, response-state and framing checks, a list and a join), about 13 % of a token's CPU at
a real pace under cProfile (docs/bench-streams.md). Here the edge's uvicorn protocol
(edge/http_protocol.py) puts a plain function in the request's scope that frames the chunk and
hands it to the transport in one call, when and only when uvicorn's `send` would have done just
that without waiting: the response is started, chunked (or, to an HTTP/1.0 client, delimited by
the close, so unframed) and not complete, the connection is up, and writing is not paused.
Otherwise it answers False and the caller awaits the ordinary send, which waits for a slow reader
(the stalled-reader watch, edge/stalled_readers.py, sees that wait), drops writes to a gone
client, or raises as before. The last write of a stream, which
completes the response, always goes through `send`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from edge import writes_together
from edge.writes_together import Write

# The scope key under which the protocol leaves the writer (absent under other servers and tests).
WRITE_NOW = "floodgate.write_now"

WriteNow = Callable[[bytes], bool]


class BodyChunkWriter:
    """`raw_write`: the connection's own transport's write, under the head-holding one
    (edge/header_write.py). A response's first body bytes go through the head-holding transport,
    which sends a held head with them; once they have, nothing is held for the rest of the
    response, and each token's chunk goes straight to the socket's transport (one Python call less
    per token).

    The cycle is held weakly: the writer sits in the cycle's own scope, and a strong reference back
    would make every request's cycle, scope and headers a reference cycle that only the garbage
    collector frees (26 objects a request; with the edge's spaced-out collections, one young
    collection of 16 ms every ~1,000 streams, a stall of every open stream). While the app runs,
    its `send` keeps the cycle alive."""

    __slots__ = ("_cycle", "_raw_write", "_write")

    def __init__(self, cycle: RequestResponseCycle, raw_write: Write) -> None:
        self._cycle = weakref.ref(cycle)
        self._raw_write = raw_write
        self._write: Write | None = None

    def write_now(self, body: bytes) -> bool:
        """Write `body` as one chunk of the started response now; False (nothing written) when the
        ordinary send must decide."""
        cycle = self._cycle()
        if (
            cycle is None
            or not body  # an empty chunk would end a chunked body
            or cycle.flow.write_paused
            or cycle.disconnected
            or cycle.response_complete
            or not cycle.response_started
        ):
            return False
        if cycle.chunked_encoding:
            chunk = b"%x\r\n%b\r\n" % (len(body), body)
        elif getattr(cycle, "until_close", False):
            chunk = body  # an HTTP/1.0 client's stream: unframed, the close ends it (edge/http_protocol.py)
        else:
            return False
        write = self._write
        if write is None:
            write = cycle.transport.write
            self._write = self._raw_write
        if writes_together.open_hold is None:
            write(chunk)
        else:
            writes_together.write(write, chunk)
        return True
