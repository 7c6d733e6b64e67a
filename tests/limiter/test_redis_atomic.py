"""Atomicity on a real redis-server: many clients and processes admitting at once never overshoot."""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest

from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer

CLIENTS = 4
PROCESSES = 2
PER_CLIENT = 50
PER_PROCESS = 150  # 4 * 50 + 2 * 150 = 500 admissions


async def _race(server: RedisServer, user: str, requests: int, tokens: int, cost: int) -> int:
    """Admissions for one user from 4 asyncio clients and 2 processes, released together; returns
    how many were admitted in all."""
    args = [server.url, user, str(PER_PROCESS), str(requests), str(tokens), str(cost)]
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.limiter.admit_worker",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(PROCESSES)
    ]
    limiters = [RedisLimiter.from_url(server.url, timeout_ms=5000) for _ in range(CLIENTS)]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert await asyncio.wait_for(worker.stdout.readline(), 30) == b"ready\n"
        limits = tier(requests=requests, request_window_s=3600, tokens=tokens, token_window_s=86400)
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
        await asyncio.gather(*(w.stdin.drain() for w in workers if w.stdin is not None))
        admissions = await asyncio.gather(
            *(
                limiter.admit(user, f"{user}-c{c}-{i}", limits, cost, 0)
                for i in range(PER_CLIENT)
                for c, limiter in enumerate(limiters)
            )
        )
        admitted = sum(a.decision.allowed for a in admissions)
        for worker in workers:
            out, _ = await asyncio.wait_for(worker.communicate(), 30)
            assert worker.returncode == 0
            admitted += int(out.decode().strip().splitlines()[-1])  # after any log lines
        return admitted
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
        for limiter in limiters:
            await limiter.aclose()


@pytest.mark.anyio
async def test_500_concurrent_admissions_with_a_limit_of_20_admit_exactly_20(
    redis_server: RedisServer,
) -> None:
    user = f"race-{uuid.uuid4().hex}"
    assert await _race(redis_server, user, requests=20, tokens=10**9, cost=1) == 20


@pytest.mark.anyio
async def test_admitted_tokens_never_exceed_the_budget_under_concurrency(redis_server: RedisServer) -> None:
    user = f"race-{uuid.uuid4().hex}"
    budget, cost = 10_000, 37
    admitted = await _race(redis_server, user, requests=10**6, tokens=budget, cost=cost)
    # Over a 1-day window the refill during the race is a fraction of one request's cost, so the
    # budget admits exactly floor(budget / cost), never one more.
    assert admitted * cost <= budget
    assert admitted == budget // cost
