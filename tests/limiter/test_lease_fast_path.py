"""Lease.try_take: the per-token charge without a coroutine, and when it hands over to take()."""

from __future__ import annotations

import pytest

from limiter.lease import Lease
from limiter.memory import MemoryLimiter
from tests.limiter.clock import ManualClock
from tests.limiter.tiers import tier


async def _lease(limiter: MemoryLimiter, tokens: int, max_output: int) -> Lease:
    admission = await limiter.admit("u", "r", tier(tokens=tokens, token_window_s=1000), 10, max_output)
    assert isinstance(admission.lease, Lease)
    return admission.lease


@pytest.mark.anyio
async def test_try_take_covers_the_reservation_then_leaves_the_store_call_to_take() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=8)
    lease = await _lease(limiter, tokens=1000, max_output=100)
    held = lease.granted
    assert [lease.try_take(1) for _ in range(held)] == [1] * held
    assert lease.try_take(1) is None  # the reservation is used up: only take() may ask the store
    assert await lease.take(1) == 1
    assert lease.granted > held
    assert lease.try_take(1) == 1  # the new batch is local arithmetic again


@pytest.mark.anyio
async def test_try_take_answers_itself_once_the_budget_is_spent_or_settled() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=8)
    lease = await _lease(limiter, tokens=14, max_output=100)  # 10 input + 4 output tokens
    assert await lease.take(8) == 4
    assert lease.try_take(1) == 0  # exhausted: no store call would change the answer
    await lease.settle()
    assert lease.try_take(1) == 0
    assert await lease.take(1) == 0
