"""A client that opens a stream over a socket with a tiny receive buffer and never reads it."""

from __future__ import annotations

import socket

from bench.stalled_socket import open_stalled
from tests.support.live_server import LiveServer

__all__ = ["open_and_never_read", "open_stalled"]


def open_and_never_read(server: LiveServer, body: dict[str, object]) -> socket.socket:
    """Send the request for `body` as the paid user; the caller closes the socket."""
    return open_stalled(server.base_url, server.keys["paid"], body)
