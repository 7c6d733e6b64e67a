"""Thousands of paced SSE streams held open by a light client, in several processes (bench.streams).

At 10,000 streams the one-process aiohttp client was the bottleneck, not the edge: on two shared
cores its per-event work (a response object, a stream reader, a chunk iterator) made the gaps it
saw its own lag. Here every stream is an `asyncio.Protocol` on uvloop over a raw socket: one
pre-built HTTP/1.1 request, and per `data_received` a few `bytes.find` to count the tokens (each
is " The", so a delta of several tokens counts as several). No HTTP or JSON parsing beyond the
status line. `processes` such clients share the streams; the parent tells them when the
measuring window opens and closes (a pipe each), and sums what they saw.

What still limits it: it runs on the same cores as the server, so a gap can include the client's
scheduling delay, and one client process holding thousands of sockets adds its own epoll latency.
The figures name the client's CPU next to the server's so a reader can tell.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

CONTENT = b'"content":"'
ERROR_EVENT = b'data: {"error"'
END_OF_BODY = b"0\r\n\r\n"


@dataclass
class Seen:
    """What one client process saw; summed over processes by `hold_streams`."""

    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    errors: int = 0
    first_tokens: int = 0
    streaming: int = 0  # streams that got a token in the window
    error_kinds: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0  # the client process's own CPU over the window


class _Window:
    def __init__(self, seen: Seen) -> None:
        self.open = False
        self.seen = seen

    def error(self, kind: str) -> None:
        self.seen.errors += 1
        self.seen.error_kinds[kind] = self.seen.error_kinds.get(kind, 0) + 1


class _Stream(asyncio.Protocol):
    __slots__ = (
        "_head",
        "_last",
        "_request",
        "_tail",
        "_token_width",
        "_transport",
        "_w",
        "_window_tokens",
        "done",
    )

    def __init__(self, request: bytes, w: _Window, token_width: int) -> None:
        self._request = request
        self._w = w
        self._token_width = token_width
        self._transport: asyncio.Transport | None = None
        self._head = True  # still before the end of the response headers
        self._tail = b""
        self._last: float | None = None
        self._window_tokens = 0
        self.done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.write(self._request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self._head:
            data = self._tail + data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._tail = data
                return
            status = data[9:12]
            if status != b"200":
                self._w.error(f"http {status.decode(errors='replace')}")
                self._finish()
                return
            self._head = False
            data = data[end + 4 :]
            self._tail = b""
        if self._tail:
            data = self._tail + data
        cut = data.rfind(b"\n\n") + 2
        self._tail = data[cut:] if cut > 1 else data
        if cut <= 1:
            return
        w = self._w
        if ERROR_EVENT in data:
            w.error("error event")
        chars = 0
        at = data.find(CONTENT, 0, cut)
        while at >= 0:
            start = at + len(CONTENT)
            chars += data.find(b'"', start) - start
            at = data.find(CONTENT, start, cut)
        if chars > 0:
            now = time.perf_counter()
            if self._last is None:
                w.seen.first_tokens += 1
            elif w.open:
                w.seen.gaps.append(now - self._last)
            self._last = now
            if w.open:
                if not self._window_tokens:
                    w.seen.streaming += 1
                n = chars // self._token_width
                self._window_tokens += n
                w.seen.tokens += n
        if END_OF_BODY in data[cut - 2 :] or data.endswith(END_OF_BODY):
            self._finish()

    def _finish(self) -> None:
        self.done = True
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done:
            self._w.error(type(exc).__name__ if exc else "closed")
            self.done = True

    def close(self) -> None:
        self.done = True
        if self._transport is not None:
            self._transport.abort()


def chat_request(host: str, port: int, key: str, body: dict[str, Any]) -> bytes:
    """A streaming chat request as raw HTTP/1.1 bytes, sent as is by every stream."""
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _hold(
    conn: Connection, host: str, port: int, request: bytes, streams: int, ramp_per_s: float, token_width: int
) -> None:
    loop = asyncio.get_running_loop()
    seen = Seen()
    w = _Window(seen)
    opened: list[_Stream] = []
    start = time.perf_counter()
    for i in range(streams):
        delay = start + i / ramp_per_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        stream = _Stream(request, w, token_width)
        opened.append(stream)
        try:
            await loop.create_connection(lambda s=stream: s, host, port)  # type: ignore[misc]
        except OSError as exc:
            stream.done = True
            w.error(type(exc).__name__)
    ramp_end = time.perf_counter()
    while seen.first_tokens + seen.errors < streams and time.perf_counter() - ramp_end < 60:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    conn.send("ramped")
    commands: asyncio.Queue[str] = asyncio.Queue()

    def command() -> None:
        try:
            commands.put_nowait(conn.recv())
        except EOFError:
            # The runner is gone (killed mid-run): its end of the pipe reads EOF for ever, and this
            # reader would spin on it, a core for nothing until someone kills the process.
            os._exit(1)

    loop.add_reader(conn.fileno(), command)
    assert await commands.get() == "open"
    cpu_before = _cpu_s()
    w.open = True
    assert await commands.get() == "close"
    w.open = False
    seen.cpu_s = _cpu_s() - cpu_before
    loop.remove_reader(conn.fileno())
    os.set_blocking(conn.fileno(), True)  # the loop made it non-blocking; the totals can be large
    for stream in opened:
        stream.close()
    conn.send(seen)


def _client_main(
    conn: Connection, host: str, port: int, request: bytes, streams: int, ramp_per_s: float, token_width: int
) -> None:
    import uvloop

    uvloop.run(_hold(conn, host, port, request, streams, ramp_per_s, token_width))


class StreamClients:
    """`processes` client processes holding `streams` streams between them (`open`, then `window`)."""

    def __init__(
        self,
        host: str,
        port: int,
        key: str,
        body: dict[str, Any],
        streams: int,
        ramp_per_s: float,
        token_width: int,
        processes: int = 2,
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        request = chat_request(host, port, key, body)
        self._conns: list[Connection] = []
        self._procs = []
        shares = [streams // processes + (1 if i < streams % processes else 0) for i in range(processes)]
        for share in shares:
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_client_main,
                args=(child, host, port, request, share, ramp_per_s / processes, token_width),
                daemon=True,
            )
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    def wait_ramped(self) -> None:
        for conn in self._conns:
            if conn.recv() != "ramped":
                raise RuntimeError("client process did not ramp")

    def open_window(self) -> None:
        for conn in self._conns:
            conn.send("open")

    def close_window(self) -> None:
        for conn in self._conns:
            conn.send("close")

    def results(self) -> Seen:
        """What the clients saw in the window (after `close_window`), summed."""
        total = Seen()
        for conn in self._conns:
            part: Seen = conn.recv()
            total.tokens += part.tokens
            total.gaps += part.gaps
            total.errors += part.errors
            total.first_tokens += part.first_tokens
            total.streaming += part.streaming
            total.cpu_s += part.cpu_s
            for kind, n in part.error_kinds.items():
                total.error_kinds[kind] = total.error_kinds.get(kind, 0) + n
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        return total

    def kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                os.kill(proc.pid, 9)  # type: ignore[arg-type]
