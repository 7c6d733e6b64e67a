"""The edge's own share of time to first token, with N streams open and new ones admitted as old
ones end, on the in-process limiter and on a real Redis (issue 11: p99 <= 3 ms at 50 concurrent).

python -m bench.ttft_overhead [--concurrency 50] [--tokens 30] [--interval-ms 33] [--duration 20]
    [--limiters memory,redis,redis-cluster-tls,bare] [--arrivals spread,burst] [--think-ms 0]
    [--connections new,kept] [--workers 1]
    [--trees a=DIR,b=DIR [--rounds N]] [--json]

The edge (the real app, bench.streams' server) streams from bench/paced_upstream.py, whose first
token comes at once: the upstream's own time to first token is one generator step (microseconds),
so what a client waits for its first content delta is the edge's overhead (parse, auth, template,
limiter admit, admission, the first events) plus loopback and the client's own reading. Each of
`--concurrency` clients opens a connection, sends a streaming request for about `--tokens` tokens
(one every `--interval-ms`, as a model streams), reads it to its end and starts the next: that many
streams are open at every moment and about concurrency / (tokens x interval) admits happen a second,
each among the others' tokens. `--arrivals spread`: streams of different lengths, clients started
apart, so admits arrive one or two at a time; `burst`: all alike, so all `--concurrency` admits
arrive in the same moment, every time (the last waits for the 49 before it). `--think-ms X`: a
client waits a random 0-X ms before its next stream. Without it, every admit follows a stream's
end, which comes at one of the upstream's steps: admits then arrive phase-locked to the step, at a
distance set by how long a stream's end takes, and a change to the end moves them nearer to or
further from the step's burst of token writes (X = the interval spreads them over the step). The
Redis rows run the limiter on a real redis-server of their own (bench/redis_process.py);
redis-cluster-tls rows on a 3-node Redis Cluster that takes TLS only, production's shape (the
tests' starter, tests/support/redis_server.py, with a throwaway CA). The bare rows are
bench/bare_sse_server.py paced alike: the same protocol and loop with nothing of the edge's, the
floor under the figure on this machine.

`--connections new`: every stream on a connection of its own, its TTFT from the connect (the TCP
handshake and the server's accept included); `kept`: each client keeps its connection alive from
stream to stream, its TTFT from sending the request, as clients through the OpenAI SDK's pool, and
a load balancer's connections to its targets, reach the edge.

Reported per limiter, arrivals and connections: TTFT p50 / p99 / max at the client (to the first
content delta), admits per second, errors, the server's CPU share and its CPU per admitted stream
(all of a stream's cost: its set-up, its tokens and its end; the bare floor's too).

`--workers N`: N server processes on one port (SO_REUSEPORT, as `serve --workers N` runs the edge,
each with its own paced upstream), so a burst of new streams is served on N loops; the bare rows
likewise. Without `--phases`, whose probe is one server's.

`--trees`: the edge served from each of these checkouts in turn (bench.streams' `tree`), `--rounds`
times over, so a change and the code before it meet the same machine in one run.

`--phases`: each edge row also says where its TTFT went inside the server (`server_phases_ms`:
first byte to first content chunk, the route, `Pipeline.admit`, the limiter's admit, the rest;
p50 / p90 / p99 / max, bench/ttft_phases.py), read from the server after each load, and what each
stream's TTFT at the client is made of (`ttft_parts_ms`: the client's moments joined with the
server's by the client's port, on the machine's one monotonic clock; `ttft_parts`): the connect, the
wait for the server loop's accept, the server's own part and the client's read, with the slowest
2 %'s mean of each (`tail`), where a slow TTFT went outside the server too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import uvloop

from bench.__main__ import machine
from bench.names import names_of
from bench.paced_upstream import TOKEN_TEXT
from bench.redis_process import RedisProcess
from bench.stream_clients import END_OF_BODY, ERROR_EVENT, chat_request
from bench.streams import Servers, _body, bare_server, servers
from bench.trees import parse_trees

CONTENT = b'"content":"' + TOKEN_TEXT.encode()


class _Moments(NamedTuple):
    """One stream's moments at the client, on the machine's monotonic clock (the server's too)."""

    port: int  # the client's own port: the server knows the connection by it
    start: float
    connected: float | None  # a new connection's connect done; None on a kept one
    first: float  # the first content delta read


class _Client:
    """One client's connection: a new one for every stream (`kept` False: every TTFT pays a TCP
    connect and the server's accept), or one kept alive from stream to stream, as the OpenAI SDK's
    connection pool and a load balancer's connections to its targets are (reopened only when the
    server closed it)."""

    def __init__(self, host: str, port: int, kept: bool, moments: list[_Moments]) -> None:
        self.host, self.port, self.kept = host, port, kept
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._moments = moments

    async def stream(self, request: bytes) -> float | None:
        """Seconds from connecting (or, on a kept connection, from sending) to the first content
        delta; None when the stream failed: not a 200, an error event, or a body that did not end
        (the connection closed mid-stream). A stream that failed after its first token is no admit:
        its TTFT would count and its failure would not."""
        start = time.perf_counter()
        connected = None
        if self._conn is None:
            self._conn = await asyncio.open_connection(self.host, self.port)
            connected = time.perf_counter()
        reader, writer = self._conn
        own_port = writer.get_extra_info("sockname")[1]
        ended = failed = False
        try:
            writer.write(request)
            first: float | None = None
            seen = b""
            # The end of the last read: an error event or the body's end may straddle two reads.
            tail = b""
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if first is None:
                    seen += data
                    if not seen.startswith(b"HTTP/1.1 200"):
                        return None
                    if CONTENT in seen:
                        now = time.perf_counter()
                        first = now - start
                        moment = _Moments(own_port, start, connected, now)
                        seen = b""
                joined, tail = tail + data, (tail + data)[-len(ERROR_EVENT) :]
                failed = failed or ERROR_EVENT in joined
                if joined.endswith(END_OF_BODY):
                    ended = True
                    break
            if first is None or failed or not ended:
                return None
            self._moments.append(moment)
            return first
        finally:
            if not (self.kept and ended):
                writer.close()
                self._conn = None


async def _load(
    server: Servers,
    concurrency: int,
    tokens: int,
    duration_s: float,
    spread: bool,
    interval_s: float,
    think_s: float = 0.0,
    kept: bool = False,
) -> dict[str, Any]:
    host, port = server.base_url.removeprefix("http://").split(":")
    # Spread: every stream of its own length (half to one and a half `tokens`), every client
    # starting at its own moment, so admits arrive one or two at a time. Burst: all the same
    # length from the same moment: the streams end at one engine step and all come back at once.
    lengths = range(max(1, tokens // 2), tokens * 3 // 2 + 1) if spread else range(tokens, tokens + 1)
    requests = [chat_request(host, int(port), server.key, _body(n)) for n in lengths]
    rng = random.Random(5)
    ttfts: list[float] = []
    moments: list[_Moments] = []
    errors = 0
    user_before, system_before = server.user_system_seconds()
    started = time.perf_counter()
    end = started + duration_s

    async def client() -> None:
        nonlocal errors
        conn = _Client(host, int(port), kept, moments)
        if spread:
            await asyncio.sleep(rng.uniform(0, tokens * interval_s))  # a start of its own
        while time.perf_counter() < end:
            try:
                ttft = await conn.stream(rng.choice(requests))
            except OSError:
                ttft = None
            if ttft is None:
                errors += 1
            else:
                ttfts.append(ttft)
            if think_s:
                await asyncio.sleep(rng.uniform(0, think_s))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    user, system = server.user_system_seconds()
    user, system = user - user_before, system - system_before
    ttfts.sort()

    def q(p: float) -> float:
        return round(ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] * 1e3, 2) if ttfts else float("nan")

    return {
        "moments": moments,
        "admits": len(ttfts),
        "admits_per_s": round(len(ttfts) / wall, 1),
        "ttft_p50_ms": q(0.50),
        "ttft_p99_ms": q(0.99),
        "ttft_max_ms": round(ttfts[-1] * 1e3, 2) if ttfts else float("nan"),
        "errors": errors,
        "server_cpu_share": round((user + system) / wall, 3),
        "server_cpu_us_per_admit": round((user + system) / max(len(ttfts), 1) * 1e6),
        # The kernel's part (socket reads and writes, epoll, loopback's delivery to the client).
        "server_system_us_per_admit": round(system / max(len(ttfts), 1) * 1e6),
    }


def _phases(server: Servers, what: str = "phases") -> Any:
    """The edge's phase summaries (`requests`: each request's moments) since the last call (None: a
    tree without the probe)."""
    answer = httpx.get(f"{server.base_url}/bench/{what}", timeout=30)
    return answer.json() if answer.status_code == 200 else None


def ttft_parts(moments: list[_Moments], served: list[list[Any]]) -> dict[str, dict[str, float]]:
    """Each stream's TTFT in parts, the client's moments joined with the server's by the client's
    port (bench/ttft_phases.py's `take_requests`): `connect` (a new connection's connect, at the
    client), `to_accept` (from there to the server loop's accept of it), `to_request` (from the
    stream's start to the server reading its request's first byte: for a new connection the two
    before and the request's read), `server` (that first byte to the first content written) and
    `to_client` (from there to the client reading it). p50 and p99 of each, and `tail`: each part's
    mean over the slowest 2 % of streams, what their TTFT is made of."""
    by_port: dict[int, list[list[Any]]] = {}
    for record in served:
        by_port.setdefault(record[0], []).append(record)
    rows: list[dict[str, float]] = []
    for m in sorted(moments, key=lambda m: m.first - m.start):
        # The port's request that began after this stream's start and wrote before its read.
        found = [r for r in by_port.get(m.port, []) if m.start - 1e-3 <= r[2] and r[3] <= m.first + 1e-3]
        if not found:
            continue
        _, accepted, begin, content = min(found, key=lambda r: r[2])
        row = {"to_request": begin - m.start, "server": content - begin, "to_client": m.first - content}
        if m.connected is not None and accepted is not None:
            row["connect"] = m.connected - m.start
            row["to_accept"] = accepted - m.connected
        rows.append(row)
    tail = rows[len(rows) - max(1, len(rows) // 50) :]
    out: dict[str, dict[str, float]] = {}
    for part in ("connect", "to_accept", "to_request", "server", "to_client"):
        xs = sorted(r[part] for r in rows if part in r)
        if not xs:
            continue
        in_tail = [r[part] for r in tail if part in r]
        out[part] = {
            "n": len(xs),
            "p50": round(xs[len(xs) // 2] * 1e3, 3),
            "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1e3, 3),
            "tail": round(sum(in_tail) / max(1, len(in_tail)) * 1e3, 3),
        }
    return out


@contextmanager
def _server(limiter: str, interval_ms: float, tree: Path | None, workers: int = 1) -> Iterator[Servers]:
    if limiter == "bare":
        with bare_server(interval_ms, 1, workers=workers) as bare:
            yield bare
        return
    if limiter == "redis-cluster-tls":
        with (
            _tls_cluster() as url,
            servers(interval_ms, workers, 1, tree=tree, redis_url=url, redis_cluster=True) as server,
        ):
            yield server
        return
    redis = RedisProcess.start() if limiter == "redis" else None
    try:
        with servers(interval_ms, workers, 1, tree=tree, redis_url=redis.url if redis else None) as server:
            yield server
    finally:
        if redis is not None:
            redis.kill()


@contextmanager
def _tls_cluster() -> Iterator[str]:
    from tests.support.redis_server import start_redis_cluster
    from tests.support.tls_files import make_tls_files

    with tempfile.TemporaryDirectory(prefix="floodgate-bench-tls-") as tmp:
        cluster = start_redis_cluster(3, tls=make_tls_files(Path(tmp)))
        try:
            yield cluster.url
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ttft_overhead")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=30, help="tokens per stream")
    parser.add_argument("--interval-ms", type=float, default=33.0)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per limiter")
    parser.add_argument(
        "--limiters",
        default="memory,redis,bare",
        type=names_of(("memory", "redis", "redis-cluster-tls", "bare")),
        help="memory, redis, redis-cluster-tls, bare",
    )
    parser.add_argument(
        "--arrivals",
        default="spread,burst",
        type=names_of(("spread", "burst")),
        help="spread, burst (see the module)",
    )
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="a random pause up to this between streams"
    )
    parser.add_argument(
        "--connections",
        default="new",
        type=names_of(("new", "kept")),
        help="new (a connection per stream), kept (one per client, kept alive), or both",
    )
    parser.add_argument("--trees", default="", help="label=DIR,...: serve the edge from each checkout")
    parser.add_argument("--rounds", type=int, default=1, help="with --trees: alternate them N times")
    parser.add_argument("--phases", action="store_true", help="where TTFT goes in the server (edge rows)")
    parser.add_argument(
        "--workers", type=int, default=1, help="server processes on one port, as `serve --workers`"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.phases and args.workers != 1:
        parser.error("--phases reads one server's probe: it needs --workers 1")
    if args.phases:
        os.environ["FLOODGATE_BENCH_PHASES"] = "1"  # read by the bench servers started below
    print(f"machine: {machine()}", flush=True)
    interval_s = args.interval_ms / 1000
    trees = parse_trees(args.trees) or [("", None)]
    runs = [
        (limiter, label, tree)
        for _ in range(args.rounds if args.trees else 1)
        for limiter in args.limiters.split(",")
        # The bare floor has no tree: once a round.
        for label, tree in (trees if limiter != "bare" else [("", None)])
    ]
    for limiter, label, tree in runs:
        with _server(limiter, args.interval_ms, tree, args.workers) as server:
            # A short warm-up: the first requests pay imports and the key cache's first read.
            uvloop.run(_load(server, 4, 2, 1.0, False, interval_s))
            for arrivals, connections in itertools.product(
                args.arrivals.split(","), args.connections.split(",")
            ):
                spread = arrivals == "spread"
                probe = args.phases and limiter != "bare"  # the floor has no edge to look into
                if probe:
                    _phases(server)  # what the warm-up or the last load left, dropped
                    _phases(server, "requests")
                load = uvloop.run(
                    _load(
                        server,
                        args.concurrency,
                        args.tokens,
                        args.duration,
                        spread,
                        interval_s,
                        args.think_ms / 1000,
                        connections == "kept",
                    )
                )
                moments = load.pop("moments")
                row = {
                    **({"tree": label} if label else {}),
                    "limiter": limiter,
                    "arrivals": arrivals,
                    "connections": connections,
                    **({"workers": args.workers} if args.workers != 1 else {}),
                    "concurrency": args.concurrency,
                    "tokens": args.tokens,
                    "interval_ms": args.interval_ms,
                    "think_ms": args.think_ms,
                    **load,
                }
                if probe and (phases := _phases(server)) is not None:
                    row["server_phases_ms"] = phases
                    row["ttft_parts_ms"] = ttft_parts(moments, _phases(server, "requests") or [])
                print(json.dumps(row) if args.json else row, flush=True)


if __name__ == "__main__":
    main()
