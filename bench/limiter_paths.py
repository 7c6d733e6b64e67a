"""The limiter's two paths to Redis side by side, on each kind of Redis the edge meets.

    .venv/bin/python -m bench.limiter_paths [--decisions N] [--concurrency C] [--rounds R] [--out F]

For each Redis (one server plain, one server TLS-only, a 3-node Cluster plain, the same TLS-only:
production's ElastiCache is the last), started on free loopback ports with a throwaway CA, the
limiter makes decisions (admit, then settle) on its own connections (limiter/direct_calls.py:
every call; on one server a batch of charges or settles in one write) and through redis-py
(`own_connections=False`: batched on one server, one call each on a Cluster, the path every call
took there before), in alternating rounds so a change in the machine's load moves both alike.
Reported per Redis and path: decisions/s, the admit's p50 / p99 (what a request waits before its
stream opens) and CPU per decision (this process plus every redis-server, from /proc). Writes a
markdown table with the machine to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.limiter import Row, _decisions, _machine
from limiter.redis_store import RedisLimiter
from tests.support.redis_server import RedisServer, start_redis, start_redis_cluster
from tests.support.tls_files import TlsFiles, make_tls_files

PATHS = ("own connections", "redis-py")


@dataclass
class Setup:
    name: str
    url: str
    cluster: bool
    servers: list[RedisServer]


async def _sample(limiter: RedisLimiter, decisions: int, clients: int, pids: list[int]) -> Row:
    row = await _decisions(limiter, decisions, clients, "", None, *pids)
    assert not limiter.fallback_active  # every decision was Redis's, none the local fallback's
    return row


def _cpu(row: Row) -> float:
    assert row.cpu_us is not None  # measured: _decisions always has a CpuMeter
    return row.cpu_us


def _setups(tls: TlsFiles) -> list[Callable[[], Setup]]:
    def single(secure: bool) -> Setup:
        server = start_redis(tls=tls if secure else None)
        return Setup(f"one server, {'TLS' if secure else 'plain'}", server.url, False, [server])

    def cluster(secure: bool) -> Setup:
        servers = start_redis_cluster(3, tls=tls if secure else None)
        return Setup(f"3-node Cluster, {'TLS' if secure else 'plain'}", servers.url, True, servers.nodes)

    return [lambda: single(False), lambda: single(True), lambda: cluster(False), lambda: cluster(True)]


async def _measure(
    setup: Setup, decisions: int, concurrency: int, rounds: int
) -> dict[tuple[str, int], list[Row]]:
    pids = [server.process.pid for server in setup.servers]
    samples: dict[tuple[str, int], list[Row]] = {}
    limiters = {
        path: RedisLimiter.from_url(
            setup.url,
            timeout_ms=5000,
            cluster=setup.cluster,
            max_connections=concurrency,
            own_connections=path == PATHS[0],
        )
        for path in PATHS
    }
    try:
        for limiter in limiters.values():
            # Warm-up at full concurrency: connections (TLS handshakes cost milliseconds of CPU
            # each), scripts, the slot map; the rounds then measure the steady state.
            await _sample(limiter, concurrency * 40, concurrency, pids)
        for clients in (1, concurrency):
            for _ in range(rounds):
                for path in PATHS:
                    count = decisions // 4 if clients == 1 else decisions
                    samples.setdefault((path, clients), []).append(
                        await _sample(limiters[path], count, clients, pids)
                    )
    finally:
        for limiter in limiters.values():
            await limiter.aclose()
    return samples


def _row(name: str, path: str, clients: int, runs: list[Row]) -> str:
    def med(f: Callable[[Row], float]) -> float:
        return statistics.median(f(s) for s in runs)

    return (
        f"| {name} | {path} | {clients} | {med(lambda s: s.per_s):,.0f} | {med(lambda s: s.p50_ms):.3f} | "
        f"{med(lambda s: s.p99_ms):.3f} | {med(_cpu):.0f} |"
    )


def _ratio_row(name: str, clients: int, ours: list[Row], theirs: list[Row]) -> str:
    def pairs(f: Callable[[Row], float]) -> str:
        values = [f(a) / f(b) for a, b in zip(ours, theirs, strict=True)]
        return f"{statistics.median(values):.2f}x ({', '.join(f'{v:.2f}' for v in values)})"

    return (
        f"| {name} | {clients} | {pairs(lambda s: s.per_s)} | {pairs(lambda s: s.p50_ms)} | "
        f"{pairs(lambda s: s.p99_ms)} | {pairs(_cpu)} |"
    )


async def run(decisions: int, concurrency: int, rounds: int) -> tuple[list[str], list[str]]:
    rows: list[str] = []
    ratios: list[str] = []
    with tempfile.TemporaryDirectory() as workdir:
        tls = make_tls_files(Path(workdir))
        for make in _setups(tls):
            setup = make()
            try:
                samples = await _measure(setup, decisions, concurrency, rounds)
            finally:
                for server in setup.servers:
                    server.kill()
            for clients in (1, concurrency):
                for path in PATHS:
                    rows.append(_row(setup.name, path, clients, samples[(path, clients)]))
                ratios.append(
                    _ratio_row(
                        setup.name, clients, samples[(PATHS[0], clients)], samples[(PATHS[1], clients)]
                    )
                )
            print("\n".join(rows[-4:]), flush=True)
    return rows, ratios


def main() -> None:
    machine = _machine()
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--decisions", type=int, default=8000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="docs/bench-limiter-paths.md")
    args = parser.parse_args()
    rows, ratios = asyncio.run(run(args.decisions, args.concurrency, args.rounds))
    table = "\n".join(
        [
            "| Redis | path | callers | decisions/s | admit p50 ms | admit p99 ms | CPU µs / decision |",
            "|---|---|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    ratio_table = "\n".join(
        [
            "| Redis | callers | decisions/s | admit p50 | admit p99 | CPU / decision |",
            "|---|---:|---:|---:|---:|---:|",
            *ratios,
        ]
    )
    print(ratio_table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        "# The limiter's paths to Redis on each kind of Redis\n\n"
        f"`.venv/bin/python -m bench.limiter_paths --decisions {args.decisions} --concurrency "
        f"{args.concurrency} --rounds {args.rounds}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n"
        f"Machine: {machine}. The Python client and every redis-server share the machine.\n\n"
        "One decision = admit + settle. *Own connections*: every call on the limiter's own connection "
        "to the node holding the user's slot (limiter/direct_calls.py; on one server concurrent "
        "settles go as one batch in one write); *redis-py*: every call through redis-py, batched on "
        "one server, one call each on a Cluster. Medians of the "
        "alternating rounds; one caller makes a quarter of the decisions.\n\n"
        f"{table}\n\nOwn connections over redis-py, pair by pair (median, then each round):\n\n"
        f"{ratio_table}\n"
    )


if __name__ == "__main__":
    main()
