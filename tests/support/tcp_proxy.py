"""A TCP proxy on a free loopback port in front of a server: the accepting half that the tests'
misbehaving proxies share (flaky_proxy.py breaks chosen connections at chosen points,
stalling_proxy.py makes open ones go silent). A subclass says what to do with each connection.

    with running(SomeProxy(upstream_port)) as proxy:   # proxy.port, proxy.connections
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from tests.support.ports import free_port


class TcpProxy:
    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.connections = 0
        self._upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", self.port))
        # The connections opened through `_upstream_for`, both ends: shut down by close(), since a
        # relay thread blocked on one (a held or silenced connection) wakes only then.
        self._sockets: list[socket.socket] = []

    def serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(client, self.connections), daemon=True).start()

    def close(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone does not on Linux.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _upstream_for(self, client: socket.socket) -> socket.socket:
        """A connection to the server for `client`'s, both closed with the proxy."""
        upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
        self._sockets += [client, upstream]
        return upstream

    def _handle(self, client: socket.socket, number: int) -> None:
        """Serve the `number`th accepted connection (from 1), on a thread of its own."""
        raise NotImplementedError


Proxy = TypeVar("Proxy", bound=TcpProxy)


def pipe(source: socket.socket, sink: socket.socket) -> None:
    """Pass what `source` sends to `sink`, then its end (a hang-up reaches the other side)."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextmanager
def running(proxy: Proxy) -> Iterator[Proxy]:
    thread = threading.Thread(target=proxy.serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.close()
        thread.join(timeout=5)
