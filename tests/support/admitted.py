"""Requests made live on a real Redis the way the edge makes them: the limiter's admit.

The fleet's cancel finds a request by its limiter slot (edge/cancel/bus.py), so the cancel tests
admit their requests with the real RedisLimiter before cancelling them, and settle the leases it
returns as a stream's end would. The `admitter` fixture keeps one limiter per Redis URL open for
the test's length (a lease settles through the limiter that granted it) and closes them after."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from limiter.base import Admission, TierLimits
from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier


class Admitter:
    def __init__(self) -> None:
        self._limiters: dict[str, RedisLimiter] = {}

    async def admission(self, url: str, request_id: str, user: str, limits: TierLimits) -> Admission:
        """The limiter's answer for 10 tokens in and 10 out, allowed or not."""
        limiter = self._limiters.get(url)
        if limiter is None:
            limiter = self._limiters[url] = RedisLimiter.from_url(url, timeout_ms=2000)
        return await limiter.admit(user, request_id, limits, 10, 10)

    async def admit(self, url: str, request_id: str, user: str = "alice") -> Admission:
        admitted = await self.admission(url, request_id, user, tier())
        assert admitted.decision.allowed and admitted.lease is not None
        return admitted

    async def aclose(self) -> None:
        for limiter in self._limiters.values():
            await limiter.aclose()
        self._limiters.clear()


@pytest.fixture
async def admitter() -> AsyncIterator[Admitter]:
    admitting = Admitter()
    yield admitting
    await admitting.aclose()
