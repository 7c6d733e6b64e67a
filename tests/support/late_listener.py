"""A loopback port that refuses connections until told to listen, then relays each one it accepts to
a server: an edge restarting, or a load balancer with no healthy target yet.

    with late_listener(upstream_port) as port:   # port.base_url refuses (ECONNREFUSED)
        port.listen()                            # from now on it accepts; port.accepted_at: when

A socket bound but not listening answers a connect with a reset (connection refused) on Linux, and
listen() on that same socket opens the port: no other process can take the port in between.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.tcp_proxy import pipe


class LateListener:
    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        # time.monotonic() of each connection accepted, in order.
        self.accepted_at: list[float] = []
        self._listening = False
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def listen(self) -> None:
        """Accept connections from now on (idempotent), relaying each to the upstream server."""
        if self._listening:
            return
        self._listening = True
        self._sock.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            self.accepted_at.append(time.monotonic())
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self._upstream_port)) as upstream:
            threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
            pipe(upstream, client)

    def close(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone does not on Linux.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)


@contextmanager
def late_listener(upstream_port: int) -> Iterator[LateListener]:
    listener = LateListener(upstream_port)
    try:
        yield listener
    finally:
        listener.close()
