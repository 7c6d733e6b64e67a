"""A request made live on a real Redis the way the edge makes it: the limiter's admit.

The fleet's cancel finds a request by its limiter slot (edge/cancel/bus.py), so the cancel tests
admit their requests with the real RedisLimiter before cancelling them."""

from __future__ import annotations

from limiter.base import Admission
from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier


async def admit(url: str, request_id: str, user: str = "alice") -> Admission:
    limiter = RedisLimiter.from_url(url, timeout_ms=2000)
    try:
        admission = await limiter.admit(user, request_id, tier(), 10, 10)
    finally:
        await limiter.aclose()
    assert admission.decision.allowed and admission.lease is not None
    return admission
