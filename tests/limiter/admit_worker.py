"""A separate process hammering the limiter: `python -m tests.limiter.admit_worker URL USER N
REQUESTS TOKENS COST`. Prints "ready", waits for a line on stdin, fires N concurrent admissions,
prints the number of admitted requests."""

from __future__ import annotations

import asyncio
import os
import sys

from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier


async def main(url: str, user: str, n: int, requests: int, tokens: int, cost: int) -> None:
    limiter = RedisLimiter.from_url(url, timeout_ms=5000)
    limits = tier(requests=requests, request_window_s=3600, tokens=tokens, token_window_s=86400)
    # Open the connections before the start signal, so the admissions land together.
    await asyncio.gather(*(limiter._client.ping() for _ in range(20)))
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    admissions = await asyncio.gather(
        # Request ids are unique across processes, as the edge's are (admit is idempotent per id).
        *(limiter.admit(user, f"{user}-w{os.getpid()}-{i}", limits, cost, 0) for i in range(n))
    )
    print(sum(a.decision.allowed for a in admissions), flush=True)
    await limiter.aclose()


if __name__ == "__main__":
    url, user, n, requests, tokens, cost = sys.argv[1:7]
    asyncio.run(main(url, user, int(n), int(requests), int(tokens), int(cost)))
