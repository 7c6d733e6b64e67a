"""A Redis that loses its data under a running edge (FLUSHALL, a restart between two of the
limiter's calls, a failover to an empty replica): the fleet's next beat finds it (its epoch gone),
and the edge's limiter puts back what it counted, its running streams' slots first of all. The
limiter's own calls need not notice: after a FLUSHALL its connections never broke."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from edge.config import FleetConfig, LimiterConfig
from edge.drain import Drain
from edge.membership.edge_fleet import joined_fleet
from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.conditions import wait_until
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer

LIMITS = tier(requests=1000, tokens=10**6, concurrent=1)


@pytest.mark.anyio
async def test_a_flushall_under_a_running_stream_leaves_its_slot_held(redis_server: RedisServer) -> None:
    """A user at their concurrency limit (one stream running) when Redis is emptied: within a beat
    the slot is back, so the user's next request is refused as before, and a cancel sent to another
    edge or worker finds the stream live (edge/cancel/bus.py reads the same slot). Before, the
    stream held no slot until it ended: the user was admitted past their limit, and such a cancel
    answered 404 while the stream went on generating."""
    url = redis_server.url
    limiter = RedisLimiter.from_url(url, timeout_ms=1000)
    settings = LimiterConfig(
        backend="redis",
        redis_url=url,
        timeout_ms=1000,
        instance_count=1,
        slot_ttl_s=300.0,
        redis_cluster=False,
    )
    fleet = FleetConfig(heartbeat_s=0.1, member_ttl_s=1.0)
    probe = Redis.from_url(url)
    user, (_, _, slots) = "flushed", user_keys("flushed")
    try:
        async with joined_fleet(
            settings,
            fleet,
            [],
            Drain(0.0, 1.0),
            limiter.set_instance_count,
            limiter.free_slots_of,
            limiter.restore_slots,
        ):
            running = await limiter.admit(user, "stream-1", LIMITS, 10, 100)
            assert running.decision.allowed and running.lease is not None
            refused = await limiter.admit(user, "stream-2", LIMITS, 10, 100)
            assert not refused.decision.allowed and refused.decision.limit == "concurrency"

            assert await probe.flushall()

            async def held() -> bool:
                return await probe.zscore(slots, "stream-1") is not None

            await wait_until("the running stream's slot is back on Redis", held)
            again = await limiter.admit(user, "stream-3", LIMITS, 10, 100)
            assert not again.decision.allowed and again.decision.limit == "concurrency"
            await running.lease.settle()
            after = await limiter.admit(user, "stream-4", LIMITS, 10, 100)
            assert after.decision.allowed and after.lease is not None
            await after.lease.settle()
    finally:
        await probe.aclose()
        await limiter.aclose()
