"""A standalone Redis failed over behind its primary endpoint (ElastiCache without cluster mode, a
Sentinel setup): the server the limiter's connection reached is demoted to a replica and answers
every script READONLY, while the endpoint's name already leads to the new primary. The limiter must
let go of the old connection, not take the replica for a store that is down for good."""

from __future__ import annotations

import uuid

import pytest

from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.conditions import wait_until
from tests.limiter.tiers import tier
from tests.support.primary_endpoint import failover_pair

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("own_connections", [True, False], ids=["own", "redis-py"])
async def test_a_primary_demoted_to_a_replica_is_left_for_the_new_primary(own_connections: bool) -> None:
    with failover_pair() as (old, new, endpoint):
        limiter = RedisLimiter.from_url(
            endpoint.url, timeout_ms=1000, backoff_s=0, own_connections=own_connections
        )
        limits = tier(requests=10**6, request_window_s=60)
        try:
            assert (await limiter.admit("warm", "w0", limits, 1, 1)).decision.allowed
            assert not limiter.fallback_active
            # The failover: the replica is promoted, the endpoint names it, the old primary
            # follows it (its open connections stay with it).
            endpoint.point_at(new.port)
            old.command("REPLICAOF", "127.0.0.1", str(new.port))
            user = f"failover-{uuid.uuid4().hex}"
            step = 0

            async def admits_on_the_new_primary() -> bool:
                nonlocal step
                step += 1
                await limiter.admit(user, f"r{step}", limits, 1, 1)
                on_new = new.command("EXISTS", user_keys(user)[0]) == b":1\r\n"
                return on_new and not limiter.fallback_active

            await wait_until("admits on the new primary", admits_on_the_new_primary, timeout_s=10)
        finally:
            await limiter.aclose()
