"""The fail-open limiter follows the live edge count: set_instance_count(n) makes it enforce 1/n of
each limit from the next decision on (its per-tier rates are derived from n, so they are rebuilt)."""

from __future__ import annotations

import pytest

from limiter.memory import MemoryLimiter
from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier
from tests.support.ports import free_port
from tests.support.redis_server import start_redis

TIER = tier(
    requests=6, request_window_s=3600.0, tokens=10**6, token_window_s=3600.0, concurrent=100, max_tokens=100
)


def _admitted(limiter: MemoryLimiter, user: str, asked: int, first: int = 0) -> int:
    """Of `asked` new requests of the user (ids from `first` on), how many are allowed."""
    ids = range(first, first + asked)
    return sum(limiter.decide(user, f"{user}-{i}", TIER, 1, 1)[0].allowed for i in ids)


def test_the_divisor_follows_the_live_count() -> None:
    clock = [0.0]
    limiter = MemoryLimiter(lambda: clock[0], instance_count=3)
    assert _admitted(limiter, "a", 10) == 2  # 6 / 3 instances
    limiter.set_instance_count(2)
    assert _admitted(limiter, "b", 10) == 3  # the cached rates of 1/3 are gone
    limiter.set_instance_count(1)
    assert _admitted(limiter, "c", 10) == 6


def test_what_a_user_spent_keeps_its_count_when_the_divisor_changes() -> None:
    """Its TATs were left in the old units: 2 requests at 1/3 of the limit read as all 6 at the
    whole (none more, a review), and 3 at 1/1 read as 1 of a share of 2 (1 more, not 0)."""
    clock = [0.0]
    limiter = MemoryLimiter(lambda: clock[0], instance_count=3)
    assert _admitted(limiter, "a", 10) == 2  # its share, 6 / 3, spent
    limiter.set_instance_count(1)
    assert _admitted(limiter, "a", 10, first=10) == 4  # the whole 6, of which it spent 2

    limiter = MemoryLimiter(lambda: clock[0], instance_count=1)
    assert _admitted(limiter, "b", 3) == 3
    limiter.set_instance_count(3)
    assert _admitted(limiter, "b", 10, first=10) == 0  # 3 spent: more than its new share of 2


@pytest.mark.anyio
async def test_a_routine_restore_after_the_fleet_shrinks_puts_back_what_was_spent() -> None:
    """Two edges, then one: a dropped connection to a Redis that kept its data makes the limiter
    restore this instance's count (restore.lua) before admitting there again. Read in the old
    units, 10 of 20 requests went back as 20: the user was refused 429 for the rest of the window."""
    limits = tier(requests=20, request_window_s=10800.0, tokens=40_000, token_window_s=86400.0, concurrent=2)
    server = start_redis()
    limiter = RedisLimiter.from_url(server.url, timeout_ms=250, instance_count=2)
    try:
        for i in range(10):
            admission = await limiter.admit("u", f"r{i}", limits, 10, 5)
            assert admission.lease is not None
            await admission.lease.take(5)
            await admission.lease.settle()
        limiter.set_instance_count(1)  # the other edge left the fleet
        assert server.command("CLIENT", "KILL", "TYPE", "normal")  # Redis keeps its data
        later = await limiter.admit("u", "r10", limits, 10, 5)
        assert later.lease is not None
        await later.lease.settle()
    finally:
        await limiter.aclose()
        server.stop()
    assert later.decision.allowed and later.decision.remaining_requests == 9


@pytest.mark.anyio
async def test_the_redis_limiters_fallback_follows_the_live_count() -> None:
    # Nothing listens on the port: every call fails at once and the fail-open tier is decided by
    # the local fallback, which set_instance_count divides.
    limiter = RedisLimiter.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_ms=200, instance_count=1)
    try:
        limiter.set_instance_count(3)
        allowed = 0
        for i in range(10):
            admission = await limiter.admit("u", f"r{i}", TIER, 1, 1)
            allowed += admission.decision.allowed
    finally:
        await limiter.aclose()
    assert limiter.fallback_active
    assert allowed == 2  # 6 / 3 instances
