"""Build the limiter the settings ask for."""

from __future__ import annotations

from collections.abc import Callable

from limiter.memory import DEFAULT_LEASE_TTL_S, MemoryLimiter
from limiter.redis_store import RedisLimiter


def create_limiter(
    backend: str,
    redis_url: str,
    timeout_ms: int,
    instance_count: int,
    clock: Callable[[], float] | None = None,
    *,
    cluster: bool = False,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
) -> MemoryLimiter | RedisLimiter:
    """backend "memory": the in-process twin (`clock` drives it; tests inject one); with
    `instance_count` > 1 each instance enforces its share of every limit.
    backend "redis": shared by every edge instance; `redis+cluster://host:port` (over TLS
    `rediss+cluster://`) or `cluster=True` talks to a Redis Cluster. `timeout_ms` bounds every Redis
    call; `instance_count` divides the limits of the local fallback used while Redis is down for
    fail-open tiers. `lease_ttl_s`: how long a request's concurrency slot lives without being
    refreshed."""
    if backend == "memory":
        return MemoryLimiter(clock, instance_count=instance_count, lease_ttl_s=lease_ttl_s)
    if backend == "redis":
        return RedisLimiter.from_url(
            redis_url,
            timeout_ms=timeout_ms,
            instance_count=instance_count,
            cluster=cluster,
            lease_ttl_s=lease_ttl_s,
        )
    raise ValueError(f"unknown limiter backend {backend!r} (expected 'memory' or 'redis')")
