"""A TCP proxy in front of a Triton replica that delivers one connection's request late: after the
`stop` request that another connection carries has been answered, as a request still on its way into
the server (a connection still being accepted, a busy frontend thread) when its `stop` overtakes it.

    with late_request_proxy(triton_port, late=2) as proxy:   # proxy.port; proxy.held: the request
"""

from __future__ import annotations

import contextlib
import socket
import threading
from contextlib import AbstractContextManager

from tests.support.tcp_proxy import TcpProxy, running

# How long the late request waits for the stop at most (then it goes on all the same).
WAIT_S = 20.0


class LateRequestProxy(TcpProxy):
    def __init__(self, upstream_port: int, late: int) -> None:
        super().__init__(upstream_port)
        self._late = late
        # The late connection's request is in hand (the client may now leave it).
        self.held = threading.Event()
        self._stop_sent = threading.Event()
        self._stop_answered = threading.Event()

    def _handle(self, client: socket.socket, number: int) -> None:
        with client, socket.create_connection(("127.0.0.1", self._upstream_port)) as upstream:
            if number == self._late:
                request = client.recv(65536)
                self.held.set()
                self._stop_answered.wait(WAIT_S)
                upstream.sendall(request)
            back = threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True)
            back.start()
            self._pipe(client, upstream, True)
            # The client is gone: so is the request, as the kernel would pass its close on.
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)
            back.join(WAIT_S)

    def _pipe(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        try:
            while data := source.recv(65536):
                if requests and b'"stop":[true]' in data:
                    self._stop_sent.set()
                elif not requests and self._stop_sent.is_set():
                    self._stop_answered.set()
                sink.sendall(data)
        except OSError:
            return


def late_request_proxy(upstream_port: int, late: int) -> AbstractContextManager[LateRequestProxy]:
    return running(LateRequestProxy(upstream_port, late))
