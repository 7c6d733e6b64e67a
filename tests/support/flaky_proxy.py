"""A real TCP proxy in front of a server (the edge, dynalite) that breaks chosen connections at chosen
points.

Each accepted connection takes the next plan from the list (then "forward" once the list runs out):
  "refuse"            read the request, then close without answering
  "cut_after_start"   pass the response up to the end of its first SSE event, then close
  "cut_after_text"    pass the response up to the end of the first event carrying text, then close
  "lose_answer"       pass the request, wait for the server's first bytes of answer, then close
                      without passing them: the request was served, the client never hears of it
  "forward"           pass everything
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.ports import free_port

_FIRST_EVENT_END = re.compile(rb'"request_id".*?\n\n', re.S)
_TEXT_EVENT_END = re.compile(rb'"delta":\{"content":"[^"].*?\n\n', re.S)
_CUTS = {"cut_after_start": _FIRST_EVENT_END, "cut_after_text": _TEXT_EVENT_END}


class FlakyProxy:
    def __init__(self, upstream_port: int, plans: list[str]) -> None:
        self.port = free_port()
        self.connections = 0
        self._upstream_port = upstream_port
        self._plans = list(plans)
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._threads: list[threading.Thread] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            plan = self._plans.pop(0) if self._plans else "forward"
            self.connections += 1
            thread = threading.Thread(target=self._handle, args=(client, plan), daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone does not on Linux.
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    def _handle(self, client: socket.socket, plan: str) -> None:
        with client:
            if plan == "refuse":
                _read_request_head(client)
                return
            with socket.create_connection(("127.0.0.1", self._upstream_port)) as upstream:
                pump = threading.Thread(target=_pipe, args=(client, upstream), daemon=True)
                pump.start()
                if plan == "lose_answer":
                    with contextlib.suppress(OSError):
                        upstream.recv(65536)
                    client.shutdown(socket.SHUT_RDWR)
                    return
                self._relay_response(upstream, client, _CUTS.get(plan))

    @staticmethod
    def _relay_response(
        upstream: socket.socket, client: socket.socket, cut: re.Pattern[bytes] | None
    ) -> None:
        seen = b""
        while True:
            try:
                data = upstream.recv(65536)
            except OSError:
                return
            if not data:
                return
            if cut is not None:
                match = cut.search(seen + data)
                if match is not None:
                    client.sendall(data[: match.end() - len(seen)])
                    client.shutdown(socket.SHUT_RDWR)
                    return
                seen += data
            client.sendall(data)


def _read_request_head(sock: socket.socket) -> None:
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(65536)
        if not data:
            return
        head += data


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        return


@contextmanager
def flaky_proxy(upstream_port: int, plans: list[str]) -> Iterator[FlakyProxy]:
    proxy = FlakyProxy(upstream_port, plans)
    thread = threading.Thread(target=proxy.serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.close()
        thread.join(timeout=5)
