"""A request whose slot lapsed (its lease's TTL passed with no charge: an edge that died, or a
stream silent that long) holds nothing any more, on Redis and in the twin alike, whether or not an
admit has pruned its entry yet: a charge grants tokens but gives no slot back, and a settle refunds
nothing. Both acted on a lapsed entry still in the set before (a review): Redis drops the whole set
when its key expires (real time) where the twin kept the entry, so the two decided differently
after a lapse, and each decided by whether an admit had pruned first.

Both sides run on one clock the test moves (the scripts take it through `now_override_us`), so
the lapse is a step of the clock and no test waits for real time to pass."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from limiter import policy
from limiter.memory import MemoryLimiter
from limiter.redis_store import RedisLimiter, restore_call
from tests.limiter.clock import ManualClock
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer

LEASE_TTL_S = 5


@pytest.fixture
async def limiters(
    redis_server: RedisServer,
) -> AsyncIterator[tuple[ManualClock, list[MemoryLimiter | RedisLimiter]]]:
    clock = ManualClock(1_000_000.0)
    twin = MemoryLimiter(clock, batch_tokens=16, lease_ttl_s=LEASE_TTL_S)
    store = RedisLimiter.from_url(
        redis_server.url,
        timeout_ms=5000,
        batch_tokens=16,
        lease_ttl_s=LEASE_TTL_S,
        now_override_us=lambda: round(clock() * policy.MICROS),
    )
    try:
        yield clock, [twin, store]
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_charge_after_the_lapse_gives_no_slot_back(
    limiters: tuple[ManualClock, list[MemoryLimiter | RedisLimiter]],
) -> None:
    clock, sides = limiters
    user, limits = f"lapse-{uuid.uuid4().hex}", tier(concurrent=1, tokens=1000, token_window_s=1000)
    for limiter in sides:
        assert (await limiter.admit(user, "r1", limits, 1, 16)).decision.allowed
        assert not (await limiter.admit(user, "r0", limits, 1, 16)).decision.allowed  # the one slot held
    clock.advance(LEASE_TTL_S + 1)
    for limiter in sides:
        assert await limiter.charge(user, limits, "r1", 5) == 5  # tokens still granted
        assert (await limiter.admit(user, "r2", limits, 1, 16)).decision.allowed, type(limiter).__name__


@pytest.mark.anyio
async def test_a_settle_after_the_lapse_refunds_nothing(
    limiters: tuple[ManualClock, list[MemoryLimiter | RedisLimiter]],
) -> None:
    clock, sides = limiters
    user, limits = f"lapse-{uuid.uuid4().hex}", tier(tokens=100, token_window_s=100_000)
    remaining = []
    for limiter in sides:
        assert (await limiter.admit(user, "r1", limits, 10, 16)).decision.allowed
    clock.advance(LEASE_TTL_S + 1)
    for limiter in sides:
        await limiter.settle(user, limits, "r1", 16, refund_request=True)
        remaining.append((await limiter.admit(user, "probe", limits, 0, 0)).decision.remaining_tokens)
    # 10 prompt tokens and the 16 leased stay spent (6 s of a 100,000 s window refill none).
    assert remaining == [100 - 26, 100 - 26]


@pytest.mark.anyio
async def test_before_the_lapse_a_charge_keeps_the_slot_and_a_settle_refunds(
    limiters: tuple[ManualClock, list[MemoryLimiter | RedisLimiter]],
) -> None:
    """The same steps a second short of the lapse: the slot is held and refreshed, the refund made."""
    clock, sides = limiters
    user, limits = f"held-{uuid.uuid4().hex}", tier(concurrent=1, tokens=100, token_window_s=100_000)
    for limiter in sides:
        assert (await limiter.admit(user, "r1", limits, 10, 16)).decision.allowed
    clock.advance(LEASE_TTL_S - 1)
    for limiter in sides:
        assert await limiter.charge(user, limits, "r1", 0) == 0
    clock.advance(LEASE_TTL_S - 1)  # past the first lease's end, within the refreshed one
    remaining = []
    for limiter in sides:
        assert not (await limiter.admit(user, "r2", limits, 0, 0)).decision.allowed  # slot still held
        await limiter.settle(user, limits, "r1", 16)
        remaining.append((await limiter.admit(user, "probe", limits, 0, 0)).decision.remaining_tokens)
    assert remaining == [100 - 10, 100 - 10]


@pytest.mark.anyio
@pytest.mark.parametrize("pruned_first", [True, False], ids=["admit-pruned-first", "lapsed-entry-unpruned"])
async def test_a_restore_gives_a_running_request_its_slot_back_whether_or_not_an_admit_pruned_first(
    limiters: tuple[ManualClock, list[MemoryLimiter | RedisLimiter]], pruned_first: bool
) -> None:
    """restore.lua (after an outage, or this instance counted out by the fleet) puts back the slots
    of the requests the instance still runs with ZADD NX: a lapsed entry not yet pruned blocked it
    (a review of the change above), so the slot came back only if some admit had pruned first."""
    clock, (_, store) = limiters
    assert isinstance(store, RedisLimiter)
    user, limits = f"restore-{uuid.uuid4().hex}", tier(concurrent=2, tokens=100, token_window_s=100_000)
    assert (await store.admit(user, "r1", limits, 10, 16)).decision.allowed
    clock.advance(LEASE_TTL_S + 1)  # r1's entry lapsed on Redis; this instance still runs r1
    if pruned_first:
        assert (await store.admit(user, "other", limits, 0, 0)).decision.allowed
    snap = policy.Snapshot(request_ahead_us=0, token_ahead_us=0, request_ids=("r1",))
    now_arg = str(round(clock() * policy.MICROS))
    call = restore_call(
        user,
        "",
        snap,
        None,
        instance="test",
        instance_count=1,
        lease_ttl_us=LEASE_TTL_S * policy.MICROS,
        now_arg=now_arg,
    )
    assert await store._send_all(store._restore, [call]) == [1]
    if not pruned_first:
        assert (await store.admit(user, "other", limits, 0, 0)).decision.allowed
    third = (await store.admit(user, "third", limits, 0, 0)).decision  # r1 and "other" hold both slots
    assert not third.allowed and third.limit == "concurrency", third
