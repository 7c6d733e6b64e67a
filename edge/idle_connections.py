"""Idle client connections, oldest first: at the connection cap one is closed to make room for a new
client, as nginx reuses its idle keep-alive connections when it runs short (ngx_drain_connections),
rather than the new client being turned away (edge/connection_cap.py). Only one idle for at least
`[server] idle_reclaim_after_s` (1 s by default) is taken.

Idle: kept alive after a response with nothing of a next request read (the OpenAI SDK keeps a pool
of them, a browser keeps one for minutes, and `http_keep_alive_s` is 75 s by default), or accepted
and sent nothing yet. Such a connection holds a descriptor and serves no one, and closing it is
what its keep-alive timeout would do anyway: a client that sends on it then sees the close and
opens another (RFC 9112 9.3.1; the OpenAI SDK retries a connection error). A connection with a
request under way (running, waiting behind another, its head or body still coming) is never one.

Turned away at the cap (503 server_busy) is now only a connection that finds every connection busy.
"""

from __future__ import annotations

from typing import Protocol

from edge.metrics import IDLE_CONNECTIONS_CLOSED


class ClosableTransport(Protocol):
    def is_closing(self) -> bool: ...

    def close(self) -> None: ...


class IdleConnection(Protocol):
    @property
    def transport(self) -> ClosableTransport: ...


class IdleConnections:
    """One listener's idle connections in the order they became idle, each with the loop time it did
    (a dict keeps the order: a connection idle again after its next response goes to the end)."""

    __slots__ = ("_idle", "after_s")

    def __init__(self, after_s: float) -> None:
        self._idle: dict[IdleConnection, float] = {}
        # Only one idle this long is taken: one just answered may be about to carry its client's
        # next request (over the network, a round trip), which would meet the close, a reset for
        # an answer: then the new client's 503, an answer with Retry-After, is the better failure.
        self.after_s = after_s

    def __len__(self) -> int:
        return len(self._idle)

    def add(self, connection: IdleConnection, now: float) -> None:
        self._idle.pop(connection, None)
        self._idle[connection] = now

    def discard(self, connection: IdleConnection) -> None:
        self._idle.pop(connection, None)

    def close_oldest(self, now: float) -> bool:
        """Close the connection idle the longest, if it has been idle long enough; False where none
        has. Its descriptor is freed as the loop next turns (the transport's close), and it leaves
        the listener's connections then (connection_lost): the reserve of descriptors covers the
        moment between."""
        for connection, since in self._idle.items():
            if connection.transport.is_closing():
                continue  # closing already (its connection_lost drops it)
            if now - since < self.after_s:
                return False  # and every one after it is younger
            del self._idle[connection]
            connection.transport.close()
            IDLE_CONNECTIONS_CLOSED.inc()
            return True
        return False
