"""A Redis at its `maxmemory` with `maxmemory-policy noeviction` (iac/modules/redis's parameter
group): it refuses the writes that would grow it, and the limiter must take that as the store
failing, whole, so that each tier's on_store_failure decides, as the parameter group says. Redis
refuses a script only at its first write that may grow memory (SET, ZADD), never a later one (it
cannot stop a script half-way)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from limiter.base import StoreUnavailable
from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer, start_redis, start_redis_cluster

pytestmark = pytest.mark.anyio


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    """A noeviction Redis already past its maxmemory (1 byte): every write that may grow it is
    refused with OOM."""
    server = start_redis(extra_args=["--maxmemory-policy", "noeviction"])
    assert server.command("CONFIG", "SET", "maxmemory", "1") == b"+OK\r\n"
    yield server
    server.kill()


def _keys_of(server: RedisServer, user: str) -> bytes:
    return server.command("KEYS", f"fg:{{{user}}}*")


@pytest.mark.parametrize("on_store_failure", ["open", "closed"])
async def test_an_admit_on_a_full_redis_is_the_store_failing_not_an_admission_there(
    full_redis: RedisServer, on_store_failure: str
) -> None:
    """admit.lua's first write was its prune of lapsed slots (ZREMRANGEBYSCORE, which never grows
    memory, so Redis lets it by), and every write after it went through: a full Redis admitted
    and grew on, while the request's first charge and its settle were refused OOM. A fail-closed
    tier's stream, admitted by Redis, was cut at its first charge (a 200 ended mid-reply instead of
    a 503 to retry), and its slot stayed held on Redis for the lease's TTL. Now the admit is
    refused before it writes anything: the tier's policy answers it, with the reason logged."""
    limiter = RedisLimiter.from_url(full_redis.url, timeout_ms=1000)
    limits = tier(requests=5, request_window_s=3600, concurrent=2, on_store_failure=on_store_failure)
    user = f"full-{uuid.uuid4().hex}"
    try:
        with capture_logs() as logs:
            if on_store_failure == "closed":
                with pytest.raises(StoreUnavailable):
                    await limiter.admit(user, f"{user}-1", limits, 10, 100)
            else:
                admission = await limiter.admit(user, f"{user}-1", limits, 10, 100)
                assert admission.decision.allowed  # by this instance's share, on the fallback
                assert admission.lease is not None
                await admission.lease.settle()
        assert limiter.fallback_active
        failed = [line for line in logs if line["event"] == "limiter_store_failed"]
        assert failed and failed[0]["op"] == "admit"
        assert "OOM" in failed[0]["detail"]
        assert _keys_of(full_redis, user) == b"*0\r\n"  # nothing written: no slot held there
    finally:
        await limiter.aclose()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "noeviction"])
async def test_connect_warns_of_a_redis_that_would_evict_the_limiters_keys(policy: str) -> None:
    """Every limiter key has a TTL, so allkeys-lru and volatile-lru (ElastiCache's default) alike
    evict them at the memory limit, and a user whose spent budget was evicted got a whole window
    again (a day's 5 requests, spent, were admitted 5 more times after other users' traffic filled
    such a Redis), with nothing said. The edge says so when it connects; noeviction is quiet."""
    server = start_redis(extra_args=["--maxmemory", "100mb", "--maxmemory-policy", policy])
    limiter = RedisLimiter.from_url(server.url, timeout_ms=1000)
    try:
        with capture_logs() as logs:
            await limiter.connect()
        warned = [line for line in logs if line["event"] == "limiter_store_evicts"]
        if policy == "noeviction":
            assert warned == []
        else:
            assert len(warned) == 1 and warned[0]["log_level"] == "warning"
            assert warned[0]["maxmemory_policy"] == policy
    finally:
        await limiter.aclose()
        server.stop()


async def test_connect_warns_of_each_cluster_primary_that_would_evict() -> None:
    """Production's Redis is a Cluster (iac/modules/redis): each primary is asked, and each one
    with an evicting policy named."""
    cluster = start_redis_cluster(3, extra_args=["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"])
    scheme, rest = cluster.url.split("://", 1)
    limiter = RedisLimiter.from_url(f"{scheme}+cluster://{rest}", timeout_ms=1000)
    try:
        with capture_logs() as logs:
            await limiter.connect()
        warned = [line for line in logs if line["event"] == "limiter_store_evicts"]
        assert sorted(line["node"] for line in warned) == sorted(f"127.0.0.1:{n.port}" for n in cluster.nodes)
    finally:
        await limiter.aclose()
        cluster.stop()
