"""The same scripts on a 3-node Redis Cluster the test starts: every user's keys share one slot,
users spread over the nodes, and the counts hold under concurrency."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import RedisCluster

from limiter.factory import create_limiter
from limiter.lease import Lease
from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisClusterServers, start_redis_cluster

USERS = 8
ATTEMPTS = 40
LIMIT = 5


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    servers = start_redis_cluster(3)
    yield servers
    servers.stop()


@pytest.mark.anyio
async def test_cluster_runs_the_scripts_and_the_counts_hold(cluster: RedisClusterServers) -> None:
    limiter = create_limiter("redis", cluster.url.replace("redis://", "redis+cluster://"), 5000, 1)
    assert isinstance(limiter, RedisLimiter)
    probe = RedisCluster.from_url(cluster.url)
    users = [f"c-{uuid.uuid4().hex}" for _ in range(USERS)]
    limits = tier(requests=LIMIT, request_window_s=3600, tokens=10**6, token_window_s=86400)
    try:
        admissions = await asyncio.gather(
            *(limiter.admit(user, f"{user}-{i}", limits, 10, 100) for i in range(ATTEMPTS) for user in users)
        )
        assert not limiter.fallback_active
        for user in users:
            mine = [a for a in admissions if a.lease is not None and a.lease._user == user]
            assert len(mine) == LIMIT

        # One slot per user (scripts may touch only keys of one slot), users on several nodes.
        slots = {user: {await probe.cluster_keyslot(key) for key in user_keys(user)} for user in users}
        assert all(len(user_slots) == 1 for user_slots in slots.values())
        nodes = {probe.get_node_from_key(user_keys(user)[0]).name for user in users}
        assert len(nodes) > 1

        lease = next(a.lease for a in admissions if isinstance(a.lease, Lease))
        assert await lease.take(200) == 100  # charged up to max_output_tokens on its node
        await lease.settle()
        assert await probe.zcard(user_keys(lease._user)[2]) == LIMIT - 1
    finally:
        await probe.aclose()
        await limiter.aclose()
