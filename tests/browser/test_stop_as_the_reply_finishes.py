"""Stop pressed as the reply finishes on the server, in a real browser against a scripted edge.

The edge marks a request finished (a cancel then answers 409 request_finished) before it writes the
reply's closing events: its last text, the final chunk, usage, [DONE] (edge/generation.py: close()
then end()). The Python client reads those on after a 409 ("the rest of the reply is on its way").
The page aborted the stream at once on any answer but 200: the tail still in flight was dropped,
the reply shown and kept in the conversation cut short and the turn said "stopped", not "done" (a
review). A 409 now reads the rest under the same grace."""

from __future__ import annotations

import socket
import threading
import time

from playwright.sync_api import Browser, expect

from edge.routes.playground import PLAYGROUND
from edge.sse import DONE, ChunkEncoder
from tests.browser.conftest import SMALL
from tests.client.scripted_edge import STREAM_HEAD, served

WAIT_MS = 30_000
TAIL_DELAY_S = 0.3
CONFLICT_BODY = (
    b'{"error":{"message":"Request chatcmpl-tail has already finished.","type":"invalid_request_error",'
    b'"param":"request_id","code":"request_finished"}}'
)
CONFLICT = (
    b"HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\nx-should-retry: false\r\n"
    + f"content-length: {len(CONFLICT_BODY)}\r\nconnection: close\r\n\r\n".encode()
    + CONFLICT_BODY
)


class FinishingEdge:
    """A stream that sends "hello", and once a cancel came (answered 409: finished) its tail."""

    def __init__(self) -> None:
        self.cancel_came = threading.Event()
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
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            line = head.split(b"\r\n")[0]
            if line.startswith(b"GET "):
                page = served(PLAYGROUND.read_bytes())
                conn.sendall(
                    page
                    if line.split(b" ")[1] == b"/"
                    else b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                )
                return
            length = next(
                (
                    int(x.split(b":")[1])
                    for x in head.split(b"\r\n")
                    if x.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(body) < length:
                body += conn.recv(65536)
            if b"/cancel " in line:
                self.cancel_came.set()
                conn.sendall(CONFLICT)
                return
            encoder = ChunkEncoder("chatcmpl-tail", SMALL, 0)
            conn.sendall(STREAM_HEAD + encoder.first() + encoder.delta("hello"))
            if not self.cancel_came.wait(timeout=60):
                return
            time.sleep(TAIL_DELAY_S)  # the closing events, written just after the registry said finished
            conn.sendall(encoder.delta(" world") + encoder.final("stop", None) + encoder.usage(3, 2) + DONE)

    def close(self) -> None:
        self._sock.close()


def test_stop_answered_409_keeps_the_rest_of_the_finished_reply(browser: Browser) -> None:
    edge = FinishingEdge()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(edge.base_url + "/")
        page.fill("#api-key", "fg-test")
        page.fill("#model", SMALL)
        page.fill("#prompt", "say hello world")
        page.click("#send")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "streaming", timeout=WAIT_MS)
        page.click("#stop")
        expect(state).to_have_attribute("data-state", "done", timeout=WAIT_MS)
        expect(page.locator("#transcript .msg.assistant")).to_have_text("hello world", timeout=WAIT_MS)
        assert page.evaluate("chat.messages[chat.messages.length - 1].content") == "hello world"
    finally:
        context.close()
        edge.close()
