"""A real HTTP proxy in front of moto's Auto Scaling API that answers the calls a test names with the
errors AWS gives (Throttling, ValidationError, AccessDenied), for a given number of calls, and
passes the rest on: an API that refuses a host for a moment (its account's request rate spent; a
role's policy not yet in effect) or for good (no lifecycle action pending). moto has no
CompleteLifecycleAction: the proxy answers it as AWS does while the hook is pending (any hook, or
only the one `pause_at` names, once), and records each result it took. moto's hosts are always
InService: the proxy gives DescribeAutoScalingInstances the LifecycleState a test names (a host in
a warm pool, or paused by a hook).

    with refusing_autoscaling(moto_endpoint) as api:   # api.url, api.calls, api.completed
        api.refuse("SetInstanceHealth", "Throttling")
        api.describe_as("Warmed:Pending:Wait")
        api.pause_at("g-drain")
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_XMLNS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
_COMPLETED = (
    f'<CompleteLifecycleActionResponse xmlns="{_XMLNS}"><CompleteLifecycleActionResult/>'
    "<ResponseMetadata><RequestId>proxy</RequestId></ResponseMetadata></CompleteLifecycleActionResponse>"
)


# The HTTP status AWS answers each refusal with (400 for the rest).
_STATUS = {"AccessDenied": 403, "ServiceUnavailable": 503}


def _error(code: str) -> str:
    return (
        f'<ErrorResponse xmlns="{_XMLNS}"><Error><Type>Sender</Type><Code>{code}</Code>'
        f"<Message>{code} (refused by the test's proxy)</Message></Error>"
        "<RequestId>proxy</RequestId></ErrorResponse>"
    )


class RefusingAutoScaling:
    def __init__(self, upstream_url: str) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.calls: list[str] = []  # every call's Action, in order
        self.completed: list[str] = []  # the LifecycleActionResult of each completion answered OK
        self._refusals: dict[str, list[str]] = {}
        self._lifecycle_state: str | None = None
        self._pending_hook: str | None = None
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                params = urllib.parse.parse_qs(body.decode())
                action = params["Action"][0]
                with proxy._lock:
                    proxy.calls.append(action)
                    refusals = proxy._refusals.get(action, [])
                    refusal = refusals.pop(0) if refusals else None
                    if (
                        action == "CompleteLifecycleAction"
                        and refusal is None
                        and proxy._pending_hook is not None
                    ):
                        # AWS completes only the hook that pauses the host, and only once.
                        if params.get("LifecycleHookName", [""])[0] == proxy._pending_hook:
                            proxy._pending_hook = ""  # no hook's name: none pending any more
                        else:
                            refusal = "ValidationError"
                if refusal is not None:
                    self._send(_STATUS.get(refusal, 400), _error(refusal).encode())
                elif action == "CompleteLifecycleAction":
                    proxy.completed.append(params["LifecycleActionResult"][0])
                    self._send(200, _COMPLETED.encode())
                else:
                    status, answer = proxy._forward(body, dict(self.headers))
                    if action == "DescribeAutoScalingInstances" and proxy._lifecycle_state is not None:
                        state = f"<LifecycleState>{proxy._lifecycle_state}</LifecycleState>".encode()
                        answer = re.sub(rb"<LifecycleState>[^<]*</LifecycleState>", state, answer)
                    self._send(status, answer)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
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

    def refuse(self, action: str, code: str, times: int = 1) -> None:
        """Answer the next `times` calls of `action` with the error `code`."""
        with self._lock:
            self._refusals.setdefault(action, []).extend([code] * times)

    def describe_as(self, lifecycle_state: str) -> None:
        """Answer DescribeAutoScalingInstances with this LifecycleState (moto's hosts are always
        InService: it has no lifecycle hooks nor warm pool)."""
        with self._lock:
            self._lifecycle_state = lifecycle_state

    def pause_at(self, hook: str) -> None:
        """Take CompleteLifecycleAction only for this hook, once, as AWS does for the hook that
        pauses the host; refuse every other (ValidationError: no lifecycle action pending)."""
        with self._lock:
            self._pending_hook = hook

    def _forward(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        passed = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        request = urllib.request.Request(self.upstream_url + "/", data=body, headers=passed, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


@contextmanager
def refusing_autoscaling(upstream_url: str) -> Iterator[RefusingAutoScaling]:
    proxy = RefusingAutoScaling(upstream_url)
    thread = threading.Thread(target=proxy._server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy._server.shutdown()
        proxy._server.server_close()
        thread.join()
