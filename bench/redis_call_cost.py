"""What one Redis round trip costs the edge's process: redis-py's calls against the floor under them.

python -m bench.redis_call_cost [--calls 4000] [--concurrency 1,16] [--repeat 2]

On a real redis-server of its own (bench/redis_process.py), uvloop, this process's CPU (and wall
time) per call for: redis-py's `set` (the call the cancel bus's owner record used to cost every
stream), a registered script by EVALSHA (the bus's cancel script, on unknown ids), the limiter's
pooled path (the call packed by limiter/resp.py, sent and read on one pooled redis-py connection,
as RedisLimiter._pipelined does where it has no connection of its own), the limiter's own
connection (limiter/resp_connection.py, every caller's command on one connection, each reply
resolving its caller in `data_received`: the path every limiter call takes now), and a bare
`asyncio.Protocol` writing a `SET` and waiting for its reply: the event loop's and the kernel's
share alone, the floor under every client.
`--concurrency`: that many callers at once (replies then share reads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import uvloop
from redis.asyncio import Redis

from bench.__main__ import machine
from bench.redis_process import RedisProcess
from edge.cancel.bus import CANCEL_SCRIPT
from limiter.redis_store import record_key, user_keys
from limiter.resp import pack_evalshas
from limiter.resp_connection import open_connection

_SET = b"*5\r\n$3\r\nSET\r\n$20\r\nfloodgate:cancel:{k}\r\n$4\r\nlive\r\n$2\r\nEX\r\n$4\r\n3600\r\n"


class _OneReply(asyncio.Protocol):
    """One command on the wire at a time: the reply sets the waiting future."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reply: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio subclass

    def data_received(self, data: bytes) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(data)


async def _measure(call: Callable[[int], Awaitable[Any]], calls: int, concurrency: int) -> dict[str, float]:
    issued = 0

    async def caller() -> None:
        nonlocal issued
        while issued < calls:
            issued += 1
            await call(issued)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return {
        "cpu_us_per_call": round((time.process_time() - cpu) / calls * 1e6, 1),
        "wall_us_per_call": round((time.perf_counter() - wall) / calls * 1e6, 1),
    }


async def _run(port: int, calls: int, concurrencies: list[int], repeat: int) -> list[dict[str, Any]]:
    client = Redis(port=port)
    script = client.register_script(CANCEL_SCRIPT)
    await client.script_load(CANCEL_SCRIPT)
    pool = client.connection_pool
    _, _, slots = user_keys("u")

    def cancel_keys(i: int) -> list[str]:
        """The cancel script's keys for an unknown request of user "u" (edge/cancel/bus.py)."""
        return [record_key("u", str(i)), slots]

    async def pooled(i: int) -> Any:
        packed = pack_evalshas(script.sha, [(cancel_keys(i), [i, 600])])
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(packed, check_health=False)
            return await conn.read_response()
        finally:
            await pool.release(conn)

    loop = asyncio.get_running_loop()
    bare: list[_OneReply] = []

    async def raw(i: int) -> bytes:
        protocol = bare.pop()
        protocol.reply = loop.create_future()
        assert protocol.transport is not None
        protocol.transport.write(_SET)
        try:
            return await protocol.reply
        finally:
            bare.append(protocol)

    own = await open_connection("127.0.0.1", port, username=None, password=None, db=0, timeout_s=5)

    async def own_connection(i: int) -> Any:
        return await own.send(pack_evalshas(script.sha, [(cancel_keys(i), [i, 600])]))

    for _ in range(max(concurrencies)):  # one connection per concurrent caller, as a pool would hold
        _, protocol = await loop.create_connection(_OneReply, "127.0.0.1", port)
        bare.append(protocol)
    variants: dict[str, Callable[[int], Awaitable[Any]]] = {
        "redis-py set": lambda i: client.set(f"floodgate:cancel:{{k{i}}}", "live", ex=3600),
        "redis-py evalsha": lambda i: script(keys=cancel_keys(i), args=[i, 600]),
        "pooled pipelined evalsha": pooled,
        "own connection evalsha": own_connection,
        "bare protocol set": raw,
    }
    rows = []
    for round_ in range(repeat):
        for concurrency in concurrencies:
            for name, call in variants.items():
                figures = await _measure(call, calls, concurrency)
                rows.append({"round": round_, "variant": name, "concurrency": concurrency, **figures})
    for protocol in bare:
        assert protocol.transport is not None
        protocol.transport.close()
    own.close()
    await client.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_call_cost")
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {machine()}", flush=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    redis = RedisProcess.start()
    try:
        rows = uvloop.run(_run(redis.port, args.calls, concurrencies, args.repeat))
    finally:
        redis.kill()
    for row in rows:
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
