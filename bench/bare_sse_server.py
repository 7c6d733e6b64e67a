"""The floor under a stream's set-up: a bare ASGI app on the edge's uvicorn settings.

python -m bench.bare_sse_server PORT READY_FILE [INTERVAL_MS REPLICAS [REPLICA_PORT]]
    (started by bench.streams_setup --bare and bench.streams --bare)

It does for `POST /v1/chat/completions` what any server must do for a one-token stream and nothing
the edge adds: read the body, parse its JSON, answer 200 with the edge's ten response headers and
the stream's bytes (first event, one delta, final event, [DONE]) in two sends, through the same
uvicorn protocol (edge/http_protocol.py) and loop. What the edge costs above it is its own work:
routing, auth, template, limiter, admission, relay, close, log line, metrics.

With INTERVAL_MS, the floor under a token at a real model's pace: the request's `max_tokens` come
from bench.streams' own paced upstream (bench/paced_upstream.py, the same step clocks), each handed
to `offer` in the clock's callback and written there as one prebuilt chunk through the protocol's
direct writer (edge/body_chunks.py), as the edge writes a token that nothing makes wait. What the
edge spends per token above it is charging, detokenizing, encoding the event and its metrics.

With REPLICA_PORT, the floor under the Triton path: each stream opens a connection of its own to
bench/zero_cost_replica.py (paced alike), sends a `generate_stream`, and for every event a read
brings writes the same prebuilt chunk, in the read's callback: the socket read per token that the
edge's Triton client makes too, without its HTTP parser, its JSON or its relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn

from bench.paced_upstream import PacedUpstream
from edge.body_chunks import WRITE_NOW
from edge.cancel.stream_close import aclose_stream
from edge.config import load_settings
from edge.server import uvicorn_config
from edge.upstreams.base import Delta, GenerationRequest

_ID = b"chatcmpl-0123456789abcdef01234567"
_FIRST = (
    b'data: {"id":"' + _ID + b'","object":"chat.completion.chunk","created":1796000000,'
    b'"model":"floodgate-tiny","request_id":"' + _ID + b'","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
)
_DELTA = (
    b'data: {"id":"' + _ID + b'","object":"chat.completion.chunk","created":1796000000,'
    b'"model":"floodgate-tiny","choices":[{"index":0,"delta":{"content":" The"},"finish_reason":null}]}\n\n'
)
_END = (
    b'data: {"id":"' + _ID + b'","object":"chat.completion.chunk","created":1796000000,'
    b'"model":"floodgate-tiny","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    b"data: [DONE]\n\n"
)
_REST = _DELTA + _END
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


def app_for(ready: Path, paced: PacedUpstream | None = None, replica_port: int | None = None) -> Any:
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
        request = json.loads(body)
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": _FIRST, "more_body": True})
        if paced is None:
            await send({"type": "http.response.body", "body": _REST, "more_body": False})
            return
        tokens = request["max_tokens"]
        relay = (
            _from_replica(replica_port, tokens, scope, send)
            if replica_port
            else _paced(paced, tokens, scope, send)
        )
        stream = asyncio.get_running_loop().create_task(relay)
        # A client gone: its stream stops, as the edge's does (edge/streaming.py, until_disconnect).
        gone = asyncio.get_running_loop().create_task(_until_disconnect(receive))
        await asyncio.wait((stream, gone), return_when=asyncio.FIRST_COMPLETED)
        for task in (stream, gone):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return app


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _paced(paced: PacedUpstream, max_tokens: int, scope: dict[str, Any], send: Any) -> None:
    write_now = scope[WRITE_NOW]

    def offer(delta: Delta) -> bool:
        return bool(write_now(_DELTA))

    request = GenerationRequest(request_id="bare", prompt_ids=[], max_new_tokens=max_tokens)
    deltas = paced.generate_direct(request, offer)
    try:
        async for delta in deltas:
            # What `offer` did not take (the first token, the last, a paused reader) goes by the send.
            if delta.finish_reason is not None:
                await send({"type": "http.response.body", "body": _REST, "more_body": False})
                return
            await send({"type": "http.response.body", "body": _DELTA, "more_body": True})
    finally:
        await aclose_stream(deltas)


class _ReplicaReader(asyncio.Protocol):
    """A replica's events, each written on as one prebuilt chunk where the read brings it."""

    def __init__(self, write_now: Any) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self._write_now = write_now

    def data_received(self, data: bytes) -> None:
        for _ in range(data.count(b"data: ")):
            self._write_now(_DELTA)
        if data.endswith(b"0\r\n\r\n") and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _from_replica(port: int, max_tokens: int, scope: dict[str, Any], send: Any) -> None:
    loop = asyncio.get_running_loop()
    reader = _ReplicaReader(scope[WRITE_NOW])
    transport, _ = await loop.create_connection(lambda: reader, "127.0.0.1", port)
    try:
        body = b'{"request_output_len":[%d]}' % max_tokens
        transport.write(
            b"POST /v2/models/tensorrt_llm/generate_stream HTTP/1.1\r\nHost: replica\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await reader.done
        await send({"type": "http.response.body", "body": _END, "more_body": False})
    finally:
        transport.abort()


def main() -> None:
    port, ready = int(sys.argv[1]), Path(sys.argv[2])
    paced = PacedUpstream(float(sys.argv[3]) / 1000, int(sys.argv[4])) if len(sys.argv) > 3 else None
    replica_port = int(sys.argv[5]) if len(sys.argv) > 5 else None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Several bare processes on one port, as `serve --workers N` runs the edge (bench.streams).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn_config(app_for(ready, paced, replica_port), load_settings(None).server, log_config=None)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
