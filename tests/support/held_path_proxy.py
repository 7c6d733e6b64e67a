"""A TCP proxy in front of an HTTP server that holds the requests for one path until the test lets
them through: an endpoint that is slow to answer (a Triton replica's model statistics) while the
rest of the server answers at once.

    with held_path_proxy(port, b"GET /v2/models/m/stats") as proxy:   # proxy.port
        ...
        proxy.arrived.wait(); proxy.release()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from contextlib import AbstractContextManager

from tests.support.tcp_proxy import TcpProxy, running

# How long a held request waits for its release at most (then it goes on all the same).
HOLD_S = 60.0


class HeldPathProxy(TcpProxy):
    def __init__(self, upstream_port: int, request_start: bytes) -> None:
        super().__init__(upstream_port)
        self._request_start = request_start
        # A held request is in hand (the client waits for its answer).
        self.arrived = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        """Let the held requests through, and those after them at once."""
        self._released.set()

    def _handle(self, client: socket.socket, number: int) -> None:
        with client, socket.create_connection(("127.0.0.1", self._upstream_port)) as upstream:
            back = threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True)
            back.start()
            self._pipe(client, upstream, True)
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)
            back.join(HOLD_S)

    def _pipe(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        try:
            while data := source.recv(65536):
                # A small request comes in one read on loopback: its start is the read's.
                if requests and data.startswith(self._request_start):
                    self.arrived.set()
                    self._released.wait(HOLD_S)
                sink.sendall(data)
        except OSError:
            return


def held_path_proxy(upstream_port: int, request_start: bytes) -> AbstractContextManager[HeldPathProxy]:
    return running(HeldPathProxy(upstream_port, request_start))
