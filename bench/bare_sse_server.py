"""The floor under a stream's set-up: a bare ASGI app on the edge's uvicorn settings.

python -m bench.bare_sse_server PORT READY_FILE   (started by bench.streams_setup --bare)

It does for `POST /v1/chat/completions` what any server must do for a one-token stream and nothing
the edge adds: read the body, parse its JSON, answer 200 with the edge's ten response headers and
the stream's bytes (first event, one delta, final event, [DONE]) in two sends, through the same
uvicorn protocol (edge/http_protocol.py) and loop. What the edge costs above it is its own work:
routing, auth, template, limiter, admission, relay, close, log line, metrics.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn

from edge.config import load_settings
from edge.server import uvicorn_config

_ID = b"chatcmpl-0123456789abcdef01234567"
_FIRST = (
    b'data: {"id":"' + _ID + b'","object":"chat.completion.chunk","created":1796000000,'
    b'"model":"floodgate-tiny","request_id":"' + _ID + b'","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
)
_REST = (
    b'data: {"id":"' + _ID + b'","object":"chat.completion.chunk","created":1796000000,'
    b'"model":"floodgate-tiny","choices":[{"index":0,"delta":{"content":" The"},"finish_reason":null}]}\n\n'
    b'data: {"id":"' + _ID + b'","object":"chat.completion.chunk","created":1796000000,'
    b'"model":"floodgate-tiny","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    b"data: [DONE]\n\n"
)
_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    *(
        (b"x-ratelimit-" + kind + b"-" + what, b"1000")
        for what in (b"requests", b"tokens")
        for kind in (b"limit", b"remaining", b"reset")
    ),
    (b"x-request-id", _ID),
]


def app_for(ready: Path) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
                ready.touch()  # noqa: ASYNC240 (once, at start-up)
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] != "/v1/chat/completions":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        json.loads(body)
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": _FIRST, "more_body": True})
        await send({"type": "http.response.body", "body": _REST, "more_body": False})

    return app


def main() -> None:
    port, ready = int(sys.argv[1]), Path(sys.argv[2])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn_config(app_for(ready), load_settings(None).server, log_config=None)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
