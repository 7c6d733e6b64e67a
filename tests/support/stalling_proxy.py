"""A TCP proxy whose open connections can be made to go silent: what a peer that vanished without a
reset looks like (a host gone mid-failover, a network path black-holed). After `stall()` the
connections open at that moment still accept bytes both ways but pass none on, and never close;
connections opened later relay normally. After `black_hole()` those opened later go silent too,
until `resume()`: the server unreachable for a while (a failover, a partition), not one path lost.
After `lose_next_reply()` the next bytes the server sends on any connection are dropped and that
connection goes silent: the request was served, its answer never arrives (the client times out and
may send it again on a new connection, which relays normally).

    with stalling_proxy(redis.port) as proxy:   # proxy.port in front of redis.port
        ...
        proxy.stall()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from tests.support.tcp_proxy import TcpProxy, running


class StallingProxy(TcpProxy):
    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self._silenced: list[threading.Event] = []
        self._black_hole = threading.Event()
        self._lock = threading.Lock()
        self._lose_reply = False
        self.replies_lost = 0

    def stall(self) -> None:
        for silenced in self._silenced:
            silenced.set()

    def black_hole(self) -> None:
        """Silence every connection, open or opened from now on, until `resume()`."""
        self._black_hole.set()
        self.stall()

    def resume(self) -> None:
        """Connections opened from now on relay again (the silenced ones stay silent)."""
        self._black_hole.clear()

    def lose_next_reply(self) -> None:
        with self._lock:
            self._lose_reply = True

    def _drops(self, silenced: threading.Event) -> bool:
        """Whether this reply is the one to lose (the connection is silenced from then on)."""
        with self._lock:
            if not self._lose_reply:
                return False
            self._lose_reply = False
            self.replies_lost += 1
        silenced.set()
        return True

    def _handle(self, client: socket.socket, number: int) -> None:
        upstream = self._upstream_for(client)
        silenced = threading.Event()
        if self._black_hole.is_set():
            silenced.set()
        self._silenced.append(silenced)
        threading.Thread(target=_pump, args=(upstream, client, silenced, self._drops), daemon=True).start()
        _pump(client, upstream, silenced)


def _pump(
    source: socket.socket,
    sink: socket.socket,
    silenced: threading.Event,
    drops: Callable[[threading.Event], bool] | None = None,
) -> None:
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
        if drops is not None and drops(silenced):
            continue
        if not silenced.is_set():
            with contextlib.suppress(OSError):
                sink.sendall(data)


def stalling_proxy(upstream_port: int) -> AbstractContextManager[StallingProxy]:
    return running(StallingProxy(upstream_port))
