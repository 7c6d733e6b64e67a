"""The fail-open limiter follows the live edge count: set_instance_count(n) makes it enforce 1/n of
each limit from the next decision on (its per-tier rates are derived from n, so they are rebuilt)."""

from __future__ import annotations

from limiter.memory import MemoryLimiter
from limiter.tiers import TierLimits

TIER = TierLimits("free", 6, 3600.0, 10**6, 3600.0, 100, 100)


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
