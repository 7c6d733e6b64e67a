"""A client's disconnect cancels its generation from the protocol's `connection_lost`, with no
task per request waiting for it.

The ASGI way to see a disconnect is a task blocked in `receive()` until `http.disconnect`: a
stream paid for that task (made, scheduled, cancelled at the end: about 1.5 % of a one-token
stream's set-up CPU, docs/bench-streams.md) although uvicorn's protocol already knows the moment
the connection goes. Here the edge's protocol (edge/http_protocol.py) puts a watch in the request's
scope, and `connection_lost` cancels the scope registered with it, in the same loop pass the
watcher's `receive()` would have woken in. Under another server (or a test's ASGI transport) there
is no watch and edge/streaming.py keeps the watcher task. Before the response, the same watch lets
go a long prompt waiting for an encode thread (edge/hang_up.py).
"""

from __future__ import annotations

import weakref

import anyio
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

# The scope key under which the protocol leaves the watch (absent under other servers and tests).
DISCONNECT_WATCH = "floodgate.disconnect_watch"


class DisconnectWatch:
    """Sits in its cycle's scope, so it holds the cycle weakly (edge/body_chunks.py says why); the
    protocol and the running app keep the cycle alive while it matters."""

    __slots__ = ("_cycle", "_gone", "_scope")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = weakref.ref(cycle)
        self._scope: anyio.CancelScope | None = None
        self._gone = False

    def watch(self, scope: anyio.CancelScope) -> None:
        """Cancel `scope` when the client goes (at once if it has gone) until `unwatch`."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected or self._gone:
            scope.cancel()
            return
        self._scope = scope
        # What the watcher's `receive()` did first: a body that filled uvicorn's buffer paused the
        # reading, and a paused socket would not tell that the client left.
        cycle.flow.resume_reading()

    def unwatch(self) -> None:
        self._scope = None

    def abort(self) -> None:
        """Drop the connection now: a close would wait to flush to a reader that never reads."""
        cycle = self._cycle()
        if cycle is not None:
            cycle.disconnected = True
            cycle.transport.abort()

    def buffered(self) -> int | None:
        """The bytes the connection holds unsent (None once the cycle is gone): less than before is
        the client reading (edge/stalled_readers.py)."""
        cycle = self._cycle()
        return None if cycle is None else cycle.transport.get_write_buffer_size()

    def pending(self) -> bool:
        """Its response has not ended."""
        cycle = self._cycle()
        return cycle is not None and not cycle.response_complete

    def connection_lost(self) -> None:
        """The protocol's `connection_lost`: a response that had not ended is the client leaving
        (an ended one is not, as `receive()` would have it too). Not `cycle.disconnected`: uvicorn
        sets it on the connection's latest cycle only."""
        cycle = self._cycle()
        if cycle is not None and cycle.response_complete:
            return
        if cycle is not None:
            # What uvicorn does for its latest cycle alone: this one's sends (the 499 its cut
            # request answers) then go nowhere, not into the closed transport, which raised.
            cycle.disconnected = True
        self._gone = True
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.cancel()
