"""Which RequestRegistry an edge runs with: its own, or one shared through Redis with the fleet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from edge.cancel.bus import RedisCancelBus
from edge.cancel.registry import CancelRegistry, RequestRegistry
from edge.cancel.shared import SharedCancelRegistry
from edge.config import LimiterConfig


@asynccontextmanager
async def open_request_registry(limiter: LimiterConfig) -> AsyncIterator[RequestRegistry]:
    """With the Redis limiter there may be other instances: a cancel reaching any of them must stop
    the stream wherever it runs, so the registry is shared over the limiter's Redis (it must be
    that one: a request is live there by the limiter's concurrency slot, edge/cancel/bus.py)."""
    local = CancelRegistry()
    if limiter.backend != "redis":
        yield local
        return
    bus = RedisCancelBus.from_url(
        limiter.redis_url, timeout_ms=limiter.timeout_ms, cluster=limiter.redis_cluster
    )
    shared = SharedCancelRegistry(local, bus)
    await shared.start()
    try:
        yield shared
    finally:
        await shared.aclose()
