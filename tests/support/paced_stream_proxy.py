"""A TCP proxy in front of a Triton replica's HTTP port that paces the next `generate_stream` answer
by the test's word, not by how fast the edge's loop happens to read: the answer's head and first
event go through at once; the events after it only once the test says the edge waits for them
(`reader_waits`); its end (the chunked body's last chunk) only once the test has seen those events
reach the relay (`relayed`). Every other request and answer passes as it comes.

What it is for: the Triton connection offers a read's tokens to the relay (triton_sse.py
`_RelayBatch`) only when the stream's reader already took a first delta, waits for the next, and
the response has not ended. Left to the replica's pace, a loaded machine's edge read the whole
answer, end included, in one read while its reader was busy with the first delta, and the relay was
never offered anything (a test that made the relay fail got a 200, 5 runs in 20 beside busy loops).

    with paced_stream_proxy(triton_port) as proxy:   # proxy.port
        proxy.pace_next_stream()
        ...  # proxy.reader_waits(), then proxy.relayed()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from tests.support.tcp_proxy import TcpProxy, running

# How long a held part of the answer waits for the test's word at most (then it goes on all the same,
# and the test fails on what it then sees rather than hanging).
HOLD_S = 60.0


@dataclass
class _Connection:
    # The answer now coming from the replica is the paced stream's.
    paced: bool = False
    buffer: bytes = b""
    head_sent: bool = False
    events_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class PacedStreamProxy(TcpProxy):
    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self._armed = threading.Event()
        self._reader_waits = threading.Event()
        self._relayed = threading.Event()

    def pace_next_stream(self) -> None:
        """Pace the answer to the next `generate_stream` request any connection carries."""
        self._armed.set()

    def reader_waits(self) -> None:
        """The edge's reader took the first delta and waits for the next: the events may follow."""
        self._reader_waits.set()

    def relayed(self) -> None:
        """The events reached the relay: the answer may end."""
        self._relayed.set()

    def _handle(self, client: socket.socket, number: int) -> None:
        with client, socket.create_connection(("127.0.0.1", self._upstream_port)) as upstream:
            state = _Connection()
            back = threading.Thread(target=self._answers, args=(upstream, client, state), daemon=True)
            back.start()
            self._requests(client, upstream, state)
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)
            back.join(HOLD_S)

    def _requests(self, source: socket.socket, sink: socket.socket, state: _Connection) -> None:
        try:
            while data := source.recv(65536):
                # A small request comes in one read on loopback: its start is the read's. Marked
                # before it is passed on: everything the replica sends after it is its answer (the
                # edge sends a request only once the previous answer is whole, so passed on).
                if data.startswith(b"POST ") and b"/generate_stream " in data and self._armed.is_set():
                    self._armed.clear()
                    with state.lock:
                        state.paced = True
                sink.sendall(data)
        except OSError:
            return

    def _answers(self, source: socket.socket, sink: socket.socket, state: _Connection) -> None:
        try:
            while data := source.recv(65536):
                with state.lock:
                    paced = state.paced
                if paced:
                    self._pace(data, sink, state)
                else:
                    sink.sendall(data)
        except OSError:
            return

    def _pace(self, data: bytes, sink: socket.socket, state: _Connection) -> None:
        """Pass on the whole parts of the paced answer that `data` completes, each when it may go."""
        state.buffer += data
        if not state.head_sent:
            end = state.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head, state.buffer = state.buffer[: end + 4], state.buffer[end + 4 :]
            sink.sendall(head)
            state.head_sent = True
            if b"transfer-encoding: chunked" not in head.lower():
                # Not a stream of events (Triton's refusal): nothing to pace.
                self._unpace(sink, state)
                return
        while (line_end := state.buffer.find(b"\r\n")) >= 0:
            size = int(state.buffer[:line_end].split(b";")[0], 16)
            # The chunk's size line, its data, and the CRLF closing it; the last chunk (size 0) is
            # closed by the empty line that ends its (absent) trailers.
            chunk_end = line_end + 2 + size + 2
            if len(state.buffer) < chunk_end:
                return
            chunk, state.buffer = state.buffer[:chunk_end], state.buffer[chunk_end:]
            if size == 0:
                self._relayed.wait(HOLD_S)
                sink.sendall(chunk)
                self._unpace(sink, state)
                return
            if state.events_sent == 1:
                self._reader_waits.wait(HOLD_S)
            sink.sendall(chunk)
            state.events_sent += 1

    def _unpace(self, sink: socket.socket, state: _Connection) -> None:
        with state.lock:
            state.paced = False
        rest, state.buffer = state.buffer, b""
        if rest:
            sink.sendall(rest)


def paced_stream_proxy(upstream_port: int) -> AbstractContextManager[PacedStreamProxy]:
    return running(PacedStreamProxy(upstream_port))
