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
from tests.support.redis_server import RedisServer, start_redis

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
