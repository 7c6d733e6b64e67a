"""A loopback HTTP server that answers the client with scripted bytes: for answers an edge cannot be
made to give at a chosen moment (a refusal mid-stream, a proxy's page in place of JSON)."""

from __future__ import annotations

import socket
import threading

FINISHED = b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"


class ScriptedEdge:
    """Answers each chat request with the next script (the last one repeats); counts them. A cancel
    gets `cancel_answer`, a whole HTTP response (by default 409: the reply had finished). With
    `hold_open`, a script's connection stays open, silent, until that event is set."""

    def __init__(
        self, scripts: list[bytes], cancel_answer: bytes = FINISHED, hold_open: threading.Event | None = None
    ) -> None:
        self.scripts = scripts
        self.cancel_answer = cancel_answer
        self.hold_open = hold_open
        self.cancels = 0
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < length:
                body += conn.recv(65536)
            if b"/cancel " in head.split(b"\r\n")[0]:
                self.cancels += 1
                conn.sendall(self.cancel_answer)
                return
            self.requests += 1
            script = self.scripts[min(self.requests, len(self.scripts)) - 1]
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + script
            )
            if self.hold_open is not None:
                self.hold_open.wait(timeout=120)

    def close(self) -> None:
        self._sock.close()
