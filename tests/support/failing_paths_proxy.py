"""A real HTTP proxy in front of a server's GET endpoints (a Triton replica's health and model
config) that answers the paths a test names with an error status instead of passing them on: a
replica whose health check or config read fails, for a moment, while the rest of it answers."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FailingPathsProxy:
    def __init__(self, upstream_url: str) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        # Path -> the status it is answered with, while named here.
        self.failing: dict[str, int] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                status = proxy.failing.get(self.path)
                body = b""
                if status is None:
                    try:
                        with urllib.request.urlopen(proxy.upstream_url + self.path, timeout=10) as answer:
                            status, body = answer.status, answer.read()
                    except urllib.error.HTTPError as exc:
                        status, body = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"


@contextmanager
def failing_paths_proxy(upstream_url: str) -> Iterator[FailingPathsProxy]:
    proxy = FailingPathsProxy(upstream_url)
    thread = threading.Thread(target=proxy._server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy._server.shutdown()
        proxy._server.server_close()
        thread.join()
