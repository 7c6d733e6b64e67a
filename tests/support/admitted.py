"""A request made live on a real Redis the way the edge makes it: the limiter's admit.

The fleet's cancel finds a request by its limiter slot (edge/cancel/bus.py), so the cancel tests
admit their requests with the real RedisLimiter before cancelling them."""

from __future__ import annotations

from limiter.base import Admission, TierLimits
from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier


async def admission(url: str, request_id: str, user: str, limits: TierLimits) -> Admission:
    """The limiter's answer for 10 tokens in and 10 out, allowed or not."""
    limiter = RedisLimiter.from_url(url, timeout_ms=2000)
    try:
        return await limiter.admit(user, request_id, limits, 10, 10)
    finally:
        await limiter.aclose()


async def admit(url: str, request_id: str, user: str = "alice") -> Admission:
    admitted = await admission(url, request_id, user, tier())
    assert admitted.decision.allowed and admitted.lease is not None
    return admitted
