"""A Triton replica with no model: Triton's HTTP `generate_stream` as the edge reads it, at no cost.

python -m bench.zero_cost_replica --port P [--interval-ms 0] [--clocks 1]

What the edge spends per token on the Triton path mixes two things: its own reading of the wire
(edge/upstreams/triton_sse.py) and the state the replica's pace leaves it in. A real tritonserver on
these cores makes 2-4K tokens/s, so the edge in front of it idles between tokens and pays a wake-up
for each; the zero-cost upstream of bench.relay hands out tokens as fast as they are taken, so the
edge there never waits. This replica speaks the same HTTP as Triton (chunked server-sent events, one
`tensorrt_llm` response per event, the KServe health routes, a TensorRT-LLM metrics page) with the
cost taken out, so that the two upstreams can be compared at the same pace:

- `--interval-ms 0`: every token as fast as the socket takes it (flow control decides), as
  bench.relay's zero-cost upstream;
- `--interval-ms X`: one step every X ms hands every running sequence its next token, one event
  each, as an engine steps its batch (bench/paced_upstream.py's step clocks: `--clocks K` engines
  whose steps do not line up take the streams in turn; 0, one per stream, so that every token is
  its own wake-up). The first token comes at once (prefill is free here), so a one-token request
  measures what setting a stream up costs.

Each event carries the outputs TensorRT-LLM's backend sends with every response (log-probs, batch
and sequence index), so the edge skips what it skips in production. The tokens are those of the
in-process upstream each mode stands beside (bench/paced_upstream.py): unpaced, whole words of the
demo tokenizer in a cycle, as bench.relay's; paced, " The" every time, whose clients count tokens
in the text.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httptools
import msgspec
import uvloop

from bench.paced_upstream import TOKEN_CYCLE, TOKEN_ID

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
)
END = b"0\r\n\r\n"
# One Triton response as an HTTP chunk, in the shape TensorRT-LLM's backend sends (%d: the token).
EVENT = (
    b'data: {"batch_index":0,"context_logits":0.0,"cum_log_probs":0.0,"generation_logits":0.0,'
    b'"model_name":"tensorrt_llm","model_version":"1","output_ids":%d,"output_log_probs":[0.0],'
    b'"sequence_index":0,"sequence_length":1}\n\n'
)


def _chunk(token: int) -> bytes:
    return b"%x\r\n%s\r\n" % (len(EVENT % token), EVENT % token)


# Tokens written per call when unpaced: the socket's flow control, not this, sets the pace.
BURST = 32

METRICS_PAGE = b"\n".join(
    b'%s{%s="%s",model="tensorrt_llm",version="1"} %d' % (family, label, kind, value)
    for family, label, kind, value in (
        (b"nv_trt_llm_request_metrics", b"request_type", b"max", 4096),
        (b"nv_trt_llm_request_metrics", b"request_type", b"active", 0),
        (b"nv_trt_llm_request_metrics", b"request_type", b"scheduled", 0),
        (b"nv_trt_llm_request_metrics", b"request_type", b"waiting", 0),
        (b"nv_trt_llm_kv_cache_block_metrics", b"kv_cache_block_type", b"max", 1 << 20),
        (b"nv_trt_llm_kv_cache_block_metrics", b"kv_cache_block_type", b"free", 1 << 20),
        (b"nv_trt_llm_kv_cache_block_metrics", b"kv_cache_block_type", b"used", 0),
        (b"nv_trt_llm_kv_cache_block_metrics", b"kv_cache_block_type", b"tokens_per", 64),
    )
)


class Body(msgspec.Struct):
    request_output_len: list[int] = msgspec.field(default_factory=lambda: [16])
    stop: list[bool] = msgspec.field(default_factory=lambda: [False])


_decode_body = msgspec.json.Decoder(Body).decode


def _plain(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


class StepClock:
    """One engine: every `interval_s` (on the grid from `phase_s`), each running sequence's next token."""

    def __init__(self, interval_s: float, phase_s: float = 0.0) -> None:
        self.interval_s = interval_s
        self.phase_s = phase_s
        self.running: set[ReplicaConnection] = set()
        # The next step's time; None while no sequence runs. (uvloop's call_at hands back a plain
        # Handle, with no `when`, for a time already past.)
        self._due: float | None = None

    def add(self, conn: ReplicaConnection) -> None:
        self.running.add(conn)
        if self._due is None:
            loop = asyncio.get_running_loop()
            steps = (loop.time() - self.phase_s) // self.interval_s + 1
            self._due = self.phase_s + steps * self.interval_s
            loop.call_at(self._due, self._step)

    def _step(self) -> None:
        for conn in list(self.running):
            conn.write_tokens(1)
        if self.running and self._due is not None:
            self._due += self.interval_s
            asyncio.get_running_loop().call_at(self._due, self._step)
        else:
            self._due = None


class Clocks:
    """The replica's engines: `count` step clocks with their phases spread over the interval, each
    new stream on the next; count 0, a clock of its own per stream (stepping from its arrival)."""

    def __init__(self, interval_s: float, count: int) -> None:
        self.interval_s = interval_s
        self._shared = [StepClock(interval_s, interval_s * i / count) for i in range(count)]
        self._next = itertools.cycle(self._shared) if count else None

    def for_new_stream(self) -> StepClock:
        if self._next is not None:
            return next(self._next)
        return StepClock(self.interval_s, asyncio.get_running_loop().time())


class ReplicaConnection(asyncio.Protocol):
    """One client connection: requests one after another, as Triton's HTTP frontend takes them."""

    def __init__(self, clocks: Clocks | None) -> None:
        self._clocks = clocks
        self._clock: StepClock | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body = b""
        self._left = 0
        self._chunks = [_chunk(TOKEN_ID)] if clocks else [_chunk(t) for t in TOKEN_CYCLE]
        self._cycle = itertools.cycle(self._chunks)
        self._paused = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._left = 0
        if self._clock is not None:
            self._clock.running.discard(self)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        url, body = self._url, self._body
        self._url, self._body = b"", b""
        assert self.transport is not None
        if url.endswith(b"/generate_stream"):
            request = _decode_body(body)
            self.transport.write(HEAD)
            if request.stop[0]:
                self.transport.write(END)  # nothing runs under that id here: nothing to stop
                return
            self._left = request.request_output_len[0]
            self._cycle = itertools.cycle(self._chunks)  # each reply from the first, as bench.relay's
            if self._clocks is None:
                self._pump()
                return
            self.write_tokens(1)
            if self._left:
                self._clock = self._clocks.for_new_stream()
                self._clock.add(self)
        elif url.endswith(b"/metrics"):
            self.transport.write(_plain(b"200 OK", METRICS_PAGE))
        elif url.endswith(b"/ready"):
            self.transport.write(_plain(b"200 OK", b""))
        else:
            self.transport.write(_plain(b"404 Not Found", b'{"error":"not found"}'))

    def write_tokens(self, n: int) -> None:
        """The next `n` tokens of the response in one write; the end with the last of them."""
        assert self.transport is not None
        n = min(n, self._left)
        self._left -= n
        data = b"".join(itertools.islice(self._cycle, n))
        if not self._left:
            data += END
            if self._clock is not None:
                self._clock.running.discard(self)
        self.transport.write(data)

    def _pump(self) -> None:
        while self._left and not self._paused:
            self.write_tokens(BURST)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._clocks is None:
            self._pump()


async def serve(port: int, interval_ms: float, clocks: int, announce: bool) -> None:
    paced = Clocks(interval_ms / 1000, clocks) if interval_ms > 0 else None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ReplicaConnection(paced), "127.0.0.1", port, backlog=4096)
    if announce:
        print("listening", flush=True)
    async with server:
        await server.serve_forever()


@contextmanager
def running_replica(
    port: int, interval_ms: float = 0.0, clocks: int = 1, cwd: Path | None = None
) -> Iterator[None]:
    """This replica in a process of its own on `port`, listening when this yields."""
    cmd = [sys.executable, "-m", "bench.zero_cost_replica", "--port", str(port), "--announce"]
    cmd += ["--interval-ms", str(interval_ms), "--clocks", str(clocks)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline() != "listening\n":
            raise RuntimeError(f"the zero-cost replica did not start (exit code {proc.wait()})")
        yield
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.zero_cost_replica")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interval-ms", type=float, default=0.0, help="0: as fast as the socket takes it")
    parser.add_argument("--clocks", type=int, default=1, help="engines stepping (0: one per stream)")
    parser.add_argument("--announce", action="store_true", help='print "listening" once it listens')
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.interval_ms, args.clocks, args.announce))


if __name__ == "__main__":
    main()
