"""A loopback HTTP server that answers the client with scripted bytes: for answers an edge cannot be
made to give at a chosen moment (a refusal mid-stream, a proxy's page in place of JSON)."""

from __future__ import annotations

import socket
import threading
import time

FINISHED = b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


def served(body: bytes, content_type: str = "text/html; charset=utf-8") -> bytes:
    """A whole HTTP response for a GET, to serve with `pages` (a page under test next to its scripts)."""
    head = f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


class ScriptedEdge:
    """Answers each chat request with the next script (the last one repeats; a stream's body, or a
    whole HTTP response when it starts with the status line); counts them. A cancel
    gets `cancel_answer`, a whole HTTP response (by default 409: the reply had finished). With
    `hold_open`, a script's connection stays open, silent, until that event is set. With
    `tail_after_cancel`, a stream sends it once a cancel has been answered and `tail_delay_s` more
    have passed (a reply that finishes just as it is cancelled). With `hold_cancel`, a cancel is
    answered only once that event is set, and the tail goes once the cancel has come, unanswered (a
    reply that finishes while its cancel is on the way). With `hold_answer`, a chat request is
    counted and then answered only once that event is set (a request in flight). With `watch_hangup`,
    a script's connection stays open, silent, until the client hangs up, which sets `hung_up`. A GET
    gets its path's answer in `pages` (whole HTTP responses), or a 404."""

    def __init__(
        self,
        scripts: list[bytes],
        cancel_answer: bytes = FINISHED,
        hold_open: threading.Event | None = None,
        pages: dict[str, bytes] | None = None,
        tail_after_cancel: bytes = b"",
        tail_delay_s: float = 0.0,
        hold_cancel: threading.Event | None = None,
        hold_answer: threading.Event | None = None,
        watch_hangup: bool = False,
    ) -> None:
        self.scripts = scripts
        self.cancel_answer = cancel_answer
        self.hold_open = hold_open
        self.pages = pages or {}
        self.tail_after_cancel = tail_after_cancel
        self.tail_delay_s = tail_delay_s
        self.hold_cancel = hold_cancel
        self.hold_answer = hold_answer
        self.watch_hangup = watch_hangup
        self.hung_up = threading.Event()
        self.cancel_asked = threading.Event()
        self.cancel_answered = threading.Event()
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
                more = conn.recv(65536)
                if not more:
                    return  # a browser's spare connection, closed unused
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            request_line = head.split(b"\r\n")[0]
            if request_line.startswith(b"GET "):
                conn.sendall(self.pages.get(request_line.split(b" ")[1].decode(), NOT_FOUND))
                return
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < length:
                body += conn.recv(65536)
            if b"/cancel " in request_line:
                self.cancels += 1
                self.cancel_asked.set()
                if self.hold_cancel is not None:
                    self.hold_cancel.wait(timeout=120)
                try:
                    conn.sendall(self.cancel_answer)
                except OSError:
                    return  # held past the client's patience: it hung up

                self.cancel_answered.set()
                return
            self.requests += 1
            script = self.scripts[min(self.requests, len(self.scripts)) - 1]
            if self.hold_answer is not None:
                self.hold_answer.wait(timeout=120)
            if not script.startswith(b"HTTP/1.1 "):  # a whole response as it is, or a stream's body
                script = STREAM_HEAD + script
            conn.sendall(script)
            cancel_came = self.cancel_answered if self.hold_cancel is None else self.cancel_asked
            if self.tail_after_cancel and cancel_came.wait(timeout=60):
                time.sleep(self.tail_delay_s)  # the tail written just after the cancel's answer
                conn.sendall(self.tail_after_cancel)
            if self.hold_open is not None:
                self.hold_open.wait(timeout=120)
            if self.watch_hangup:
                try:
                    while conn.recv(65536):
                        pass
                except OSError:
                    pass  # reset: hung up too
                self.hung_up.set()

    def close(self) -> None:
        self._sock.close()
