"""The headers the edge sends with every answer, and Retry-After on a denial."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from limiter import policy
from limiter.base import Decision
from limiter.headers import openai_duration, ratelimit_headers
from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (20, "20ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (360_000, "6m0s"),
        (3_723_004, "1h2m3.004s"),
        (10_800_000, "3h0m0s"),
    ],
)
def test_durations_are_written_the_way_openai_writes_them(ms: int, text: str) -> None:
    assert openai_duration(ms) == text


def _decision(allowed: bool, retry_after_ms: int) -> Decision:
    return Decision(
        allowed=allowed,
        limit=None if allowed else "tokens",
        retry_after_ms=retry_after_ms,
        limit_requests=20,
        remaining_requests=19,
        reset_requests_ms=540_000,
        limit_tokens=40_000,
        remaining_tokens=39_000,
        reset_tokens_ms=2_160,
    )


def test_allowed_answers_carry_the_ratelimit_headers_without_retry_after() -> None:
    assert ratelimit_headers(_decision(True, 0)) == {
        "x-ratelimit-limit-requests": "20",
        "x-ratelimit-remaining-requests": "19",
        "x-ratelimit-reset-requests": "9m0s",
        "x-ratelimit-limit-tokens": "40000",
        "x-ratelimit-remaining-tokens": "39000",
        "x-ratelimit-reset-tokens": "2.16s",
    }


def test_denials_add_retry_after_rounded_up_and_the_exact_ms() -> None:
    headers = ratelimit_headers(_decision(False, 6_401))
    assert headers["retry-after"] == "7"
    assert headers["retry-after-ms"] == "6401"


@pytest.mark.anyio
async def test_the_fallback_never_reports_a_negative_remaining_budget(own_redis_server: RedisServer) -> None:
    """One of two edges admitted 8 of a user's 10 requests an hour on Redis; Redis dies. Its
    fail-open fallback enforces half the tier and mirrors those 8 (more than its half): it refuses,
    rightly, but its headers said x-ratelimit-remaining-requests -3 and remaining-tokens -300. A
    budget holds no fewer than none: OpenAI's headers never go below 0, and a client pacing itself
    by them reads a negative count as garbage."""
    limits = tier(requests=10, request_window_s=3600, tokens=1000, token_window_s=3600)
    limiter = RedisLimiter.from_url(own_redis_server.url, timeout_ms=2000, instance_count=2, backoff_s=60)
    user = f"neg-{uuid.uuid4().hex}"
    try:
        for i in range(8):
            admission = await limiter.admit(user, f"r{i}", limits, 100, 0)
            assert admission.decision.allowed and admission.lease is not None
            assert not limiter.fallback_active
            await admission.lease.settle()
        own_redis_server.kill()
        refused = (await limiter.admit(user, "after", limits, 100, 0)).decision
        assert limiter.fallback_active and not refused.allowed
        assert refused.remaining_requests == 0 and refused.remaining_tokens == 0, refused
        headers = ratelimit_headers(refused)
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-remaining-tokens"] == "0"
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_redis_never_reports_a_negative_remaining_budget(redis_server: RedisServer) -> None:
    """A budget restore.lua left past its window (N edges' fallback counts added up after an
    outage, each within its own share, together over the tier): admit.lua's room came out
    negative, so Redis's answers said x-ratelimit-remaining-tokens -500 until it drained."""
    now_us = 10**12
    limits = tier(requests=10, request_window_s=60, tokens=1000, token_window_s=60, name="paid")
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=2000, now_override_us=lambda: now_us)
    user = f"neg-{uuid.uuid4().hex}"
    request_key, token_key, _ = user_keys(user, limits.name)
    client = Redis.from_url(redis_server.url)
    try:
        # 1.5 windows owed on each budget, as a restore adding two instances' ledgers leaves them.
        await client.set(request_key, now_us + 90 * policy.MICROS, px=120_000)
        await client.set(token_key, now_us + 90 * policy.MICROS, px=120_000)
        refused = (await limiter.admit(user, "r", limits, 10, 0)).decision
        assert not refused.allowed
        assert refused.remaining_requests == 0 and refused.remaining_tokens == 0, refused
    finally:
        await client.aclose()
        await limiter.aclose()
