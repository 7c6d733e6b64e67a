"""The limiter's shared writers run in a context of their own, not the request's that started them.

A writer started lazily by the first request's call kept that request's bound log fields (its
request_id) for the life of the process: during a Redis outage every `limiter_store_failed`,
`limiter_store_recovered` and `limiter_restored` line named a request long finished, and none the
requests then failing (the observability review, on a live edge).
"""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from limiter.call_batcher import CallBatcher
from limiter.settle_queue import PendingSettle, SettleQueue
from limiter.store_health import StoreHealth


@pytest.mark.anyio
async def test_the_settle_writer_does_not_log_under_the_request_that_started_it() -> None:
    seen: list[dict[str, Any]] = []

    async def send(batch: list[PendingSettle]) -> bool:
        seen.append(structlog.contextvars.get_contextvars())
        return True

    queue = SettleQueue(send, StoreHealth(backoff_s=1.0))
    with structlog.contextvars.bound_contextvars(request_id="chatcmpl-first"):
        await queue.submit(PendingSettle(["k"], [1], expires_at=float("inf")))
    with structlog.contextvars.bound_contextvars(request_id="chatcmpl-second"):
        await queue.submit(PendingSettle(["k"], [1], expires_at=float("inf")))
    await queue.aclose()

    assert seen == [{}, {}]


@pytest.mark.anyio
async def test_a_batch_writer_does_not_log_under_the_request_that_started_it() -> None:
    seen: list[dict[str, Any]] = []

    async def send(calls: list[Any], epoch: int) -> list[int]:
        seen.append(structlog.contextvars.get_contextvars())
        return [0 for _ in calls]

    batcher = CallBatcher(send)
    with structlog.contextvars.bound_contextvars(request_id="chatcmpl-first"):
        assert await batcher.call(["k"], [1], epoch=0) == 0

    assert seen == [{}]
