"""The fail-open limiter follows the live edge count: set_instance_count(n) makes it enforce 1/n of
each limit from the next decision on (its per-tier rates are derived from n, so they are rebuilt)."""

from __future__ import annotations

import pytest

from limiter.memory import MemoryLimiter
from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier
from tests.support.ports import free_port

TIER = tier(
    requests=6, request_window_s=3600.0, tokens=10**6, token_window_s=3600.0, concurrent=100, max_tokens=100
)


def _admitted(limiter: MemoryLimiter, user: str, asked: int) -> int:
    return sum(limiter.decide(user, f"{user}-{i}", TIER, 1, 1)[0].allowed for i in range(asked))


def test_the_divisor_follows_the_live_count() -> None:
    clock = [0.0]
    limiter = MemoryLimiter(lambda: clock[0], instance_count=3)
    assert _admitted(limiter, "a", 10) == 2  # 6 / 3 instances
    limiter.set_instance_count(2)
    assert _admitted(limiter, "b", 10) == 3  # the cached rates of 1/3 are gone
    limiter.set_instance_count(1)
    assert _admitted(limiter, "c", 10) == 6


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
