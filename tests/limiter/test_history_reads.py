"""The history reads' own budget (limiter/reads.py): on Redis and in process alike, a user's reads
are limited apart from its chat completions' requests, and one user's reads spend no one else's."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from limiter import policy
from limiter.base import TierLimits
from limiter.factory import create_limiter
from limiter.memory import MemoryLimiter
from limiter.reads import SWEEP_SLICE, ReadBuckets
from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio


def _reads(limit: int) -> TierLimits:
    return msgspec.structs.replace(
        tier(requests=5, request_window_s=3600), history_reads_per_window=limit, history_read_window_s=3600
    )


async def _spend_reads_then_chat(limiter: MemoryLimiter | RedisLimiter) -> None:
    user, other, limits = f"u-{uuid.uuid4().hex}", f"u-{uuid.uuid4().hex}", _reads(2)
    first = await limiter.take_read(user, limits)
    second = await limiter.take_read(user, limits)
    denied = await limiter.take_read(user, limits)
    assert (first.allowed, first.limit, first.remaining) == (True, 2, 1)
    assert (second.allowed, second.remaining) == (True, 0)
    assert not denied.allowed and denied.remaining == 0
    # One read back per half the window (2 an hour): the wait says so, not a whole window.
    assert 0 < denied.retry_after_ms <= 1_800_000
    assert (await limiter.take_read(other, limits)).allowed
    chat = (await limiter.admit(user, "r1", limits, 1, 1)).decision
    assert chat.allowed and chat.remaining_requests == 4  # the reads spent none of the 5 requests


async def test_memory_limits_reads_in_a_budget_of_their_own() -> None:
    limiter = MemoryLimiter()
    try:
        await _spend_reads_then_chat(limiter)
    finally:
        await limiter.aclose()


async def test_redis_limits_reads_in_a_budget_of_their_own(redis_server: RedisServer) -> None:
    limiter = create_limiter("redis", redis_server.url, 1000, 1)
    assert isinstance(limiter, RedisLimiter)
    try:
        await _spend_reads_then_chat(limiter)
    finally:
        await limiter.aclose()


async def test_reads_are_limited_on_this_edges_share_while_redis_is_down() -> None:
    """Nothing listens: every read falls back to the in-process budget, the share of one of two
    edges, and is never answered with the store's failure."""
    limiter = create_limiter("redis", f"redis://127.0.0.1:{free_port()}", 200, 2)
    user, limits = f"u-{uuid.uuid4().hex}", _reads(4)
    try:
        answers = [await limiter.take_read(user, limits) for _ in range(3)]
    finally:
        await limiter.aclose()
    assert [a.allowed for a in answers] == [True, True, False]
    assert answers[0].limit == 2


async def test_the_fallbacks_reads_follow_the_live_edge_count_as_its_other_budgets() -> None:
    """An outage across a fleet change (2 edges, then 1): the reads a user spent of the first
    share stay that many reads of the new one, as the fallback's requests and tokens do
    (MemoryLimiter.set_instance_count). Kept in the old share's units, 2 of a 4-read tier read as
    all 4 on the edge left, and the user was refused for up to a window."""
    limiter = create_limiter("redis", f"redis://127.0.0.1:{free_port()}", 200, 2)
    assert isinstance(limiter, RedisLimiter)
    user, limits = f"u-{uuid.uuid4().hex}", _reads(4)
    try:
        spent = [await limiter.take_read(user, limits) for _ in range(2)]
        limiter.set_instance_count(1)
        after = await limiter.take_read(user, limits)
    finally:
        await limiter.aclose()
    assert [a.allowed for a in spent] == [True, True] and spent[1].remaining == 0
    assert (after.allowed, after.limit, after.remaining) == (True, 4, 1)


def test_one_read_looks_at_a_slice_of_the_buckets_held_and_the_full_ones_go() -> None:
    """The in-process buckets are dropped once full again, a slice at a time: a read that swept
    every bucket held stalled the event loop, and every stream on the edge, in proportion to the
    users (about 90 ms at 400,000 here). Each read drops at most SWEEP_SLICE, and a pass over them
    all drops every full one."""
    buckets, limits = ReadBuckets(), _reads(600)
    users = 30_000
    for i in range(users):
        assert buckets.take(f"old-{i}", limits, 0).allowed
    later = 3_600 * policy.MICROS  # every one of them full again
    dropped = []
    for i in range(3 * users):
        held = len(buckets)
        assert buckets.take(f"new-{i}", limits, later).allowed
        dropped.append(held + 1 - len(buckets))
    assert max(dropped) <= SWEEP_SLICE
    assert len(buckets) == 3 * users  # every old one went; the new ones are held until full
