"""A TCP proxy whose open connections can be made to go silent: what a peer that vanished without a
reset looks like (a host gone mid-failover, a network path black-holed). After `stall()` the
connections open at that moment still accept bytes both ways but pass none on, and never close;
connections opened later relay normally.

    with stalling_proxy(redis.port) as proxy:   # proxy.port in front of redis.port
        ...
        proxy.stall()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.ports import free_port


class StallingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.connections = 0
        self._upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._silenced: list[threading.Event] = []
        self._sockets: list[socket.socket] = []

    def stall(self) -> None:
        for silenced in self._silenced:
            silenced.set()

    def serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
            self.connections += 1
            silenced = threading.Event()
            self._silenced.append(silenced)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink, silenced), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _pump(source: socket.socket, sink: socket.socket, silenced: threading.Event) -> None:
    while True:
        try:
            data = source.recv(65536)
        except OSError:
            return
        if not data:
            if not silenced.is_set():
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
            return
        if not silenced.is_set():
            with contextlib.suppress(OSError):
                sink.sendall(data)


@contextmanager
def stalling_proxy(upstream_port: int) -> Iterator[StallingProxy]:
    proxy = StallingProxy(upstream_port)
    thread = threading.Thread(target=proxy.serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.close()
        thread.join(timeout=5)
