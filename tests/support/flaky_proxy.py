"""A real TCP proxy in front of a server (the edge, dynalite) that breaks chosen connections at chosen
points.

Each accepted connection takes the next plan from the list (then "forward" once the list runs out):
  "refuse"            read the request, then close without answering
  "cut_after_start"   pass the response up to the end of its first SSE event, then close
  "cut_after_text"    pass the response up to the end of the first event carrying text, then close
  "cut_before_text"   pass the response up to the first event carrying text, then close without it:
                      the edge generated (and charged) that text, the client never sees it
  "reset_after_text"  the same, then reset the connection (RST) instead of closing it
  "lose_answer"       pass the request, wait for the server's first bytes of answer, then close
                      without passing them: the request was served, the client never hears of it
  "forward"           pass everything
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from contextlib import AbstractContextManager

from tests.support.tcp_proxy import TcpProxy, running

_FIRST_EVENT_END = re.compile(rb'"request_id".*?\n\n', re.S)
_TEXT_EVENT_END = re.compile(rb'"delta":\{"content":"[^"].*?\n\n', re.S)
# The end of the event before it (its chunk's size line may come between).
_TEXT_EVENT_START = re.compile(rb'\n\n(?=(?:\r\n[0-9a-fA-F]+\r\n)?data: [^\n]*?"delta":\{"content":"[^"])')
_CUTS = {
    "cut_after_start": _FIRST_EVENT_END,
    "cut_after_text": _TEXT_EVENT_END,
    "cut_before_text": _TEXT_EVENT_START,
    "reset_after_text": _TEXT_EVENT_END,
}


class FlakyProxy(TcpProxy):
    def __init__(self, upstream_port: int, plans: list[str]) -> None:
        super().__init__(upstream_port)
        self._plans = list(plans)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _handle(self, client: socket.socket, number: int) -> None:
        plan = self._plans[number - 1] if number <= len(self._plans) else "forward"
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
                self._relay_response(upstream, client, _CUTS.get(plan), reset=plan.startswith("reset"))

    @staticmethod
    def _relay_response(
        upstream: socket.socket, client: socket.socket, cut: re.Pattern[bytes] | None, reset: bool
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
                    client.sendall(data[: max(0, match.end() - len(seen))])
                    if reset:
                        # Linger on, for no time: the close sends a RST, as a crashed peer's host does.
                        # SHUT_RD first wakes the pump blocked reading it, which would hold it open.
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        client.shutdown(socket.SHUT_RD)
                        client.close()
                    else:
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


def flaky_proxy(upstream_port: int, plans: list[str]) -> AbstractContextManager[FlakyProxy]:
    return running(FlakyProxy(upstream_port, plans))
