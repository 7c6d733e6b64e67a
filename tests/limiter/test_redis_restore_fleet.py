"""Several edge instances restoring Redis after one outage: what each admitted on its fallback adds
up there (restore.lua), once, whether Redis kept its data or came back empty."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from limiter import policy
from limiter.memory import MemoryLimiter
from limiter.redis_store import RedisLimiter, user_keys
from limiter.scripts import script_text
from tests.limiter.clock import ManualClock
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer, start_redis

# 10 requests an hour (one every 360 s); tokens and slots never bind.
LIMITS = tier(requests=10, request_window_s=3600, tokens=10**9, token_window_s=60)
INTERVAL_US = 360 * policy.MICROS


async def _allowed(store: RedisLimiter, user: str, request_id: str) -> bool:
    return (await store.admit(user, request_id, LIMITS, 1, 0)).decision.allowed


@pytest.mark.anyio
@pytest.mark.parametrize("kept", [True, False], ids=["redis-kept-its-data", "redis-restarted-empty"])
async def test_two_instances_fallback_admits_add_up_on_redis_after_the_outage(
    own_redis_server: RedisServer, kept: bool
) -> None:
    """Two edges each admit 2 on Redis, then, Redis down, 3 more on their fallback (their share is
    5 of 10): the user had all 10. Taking the later of the two instances' TATs, Redis counted 5 and
    admitted 5 more. Now, Redis kept its data: after both restored it refuses the next one and
    admits one an interval later. Redis restarted empty: both fallbacks' 6 are back, and one
    instance's 2 from before the outage (its own lead), but the other's 2 went with Redis's data
    (restore.lua's header): 2 more are admitted, not 5."""
    now_us = 10**15  # Redis's clock, held still: the twins' own clocks move by the test's milliseconds

    def clock() -> int:
        return now_us

    edges = [
        RedisLimiter.from_url(
            own_redis_server.url, timeout_ms=1000, instance_count=2, backoff_s=0, now_override_us=clock
        )
        for _ in range(2)
    ]
    user = f"u-{uuid.uuid4().hex}"
    restarted: RedisServer | None = None
    probe = Redis.from_url(own_redis_server.url)
    try:
        for e, edge in enumerate(edges):
            assert [await _allowed(edge, user, f"e{e}-r{i}") for i in range(2)] == [True, True]
        # What Redis holds before it goes, to put back into the restarted one (its data kept).
        dumps = [(key, await probe.pttl(key), await probe.dump(key)) for key in await probe.keys("*")]
        await probe.aclose()
        own_redis_server.kill()

        for e, edge in enumerate(edges):
            outage = [await _allowed(edge, user, f"e{e}-f{i}") for i in range(4)]
            assert outage == [True, True, True, False]  # this edge's share: 5 of the tier's 10
            assert edge.fallback_active

        restarted = start_redis(own_redis_server.port)
        probe = Redis.from_url(restarted.url)
        if kept:
            for key, ttl_ms, dump in dumps:
                assert dump is not None
                await probe.restore(key, max(ttl_ms, 0), dump)
        assert int(await probe.exists(user_keys(user)[0])) == int(kept)

        # Each edge restores in the background once Redis answers it (its first admit there,
        # whoever that admit is for): here both have, before either admits for the user. (Until
        # the other one has, the first may admit what the other's fallback did: each restore is
        # one instance's.)
        for e, edge in enumerate(edges):
            assert await _allowed(edge, f"other-{uuid.uuid4().hex}", f"e{e}-o")
            assert edge._restoring is not None
            await edge._restoring
        assert not any(edge.fallback_active for edge in edges)
        assert all(edge._in_sync() for edge in edges)
        if not kept:
            extra = [await _allowed(edges[i % 2], user, f"x{i}") for i in range(6)]
            assert extra == [True, True, False, False, False, False]
            return
        after = [(await edge.admit(user, f"e{e}-a", LIMITS, 1, 0)).decision for e, edge in enumerate(edges)]
        assert [d.allowed for d in after] == [False, False], after
        assert after[1].limit == "requests" and after[1].remaining_requests == 0
        # The 10th request's interval, give or take the twins' drift (under a second).
        assert INTERVAL_US / 1000 - 1000 <= after[1].retry_after_ms <= INTERVAL_US / 1000

        now_us += INTERVAL_US
        assert [await _allowed(edges[0], user, f"later{i}") for i in range(2)] == [True, False]
    finally:
        await probe.aclose()
        for edge in edges:
            await edge.aclose()
        if restarted is not None:
            restarted.kill()


@pytest.mark.anyio
async def test_a_restore_sent_twice_counts_its_ledger_once(redis_server: RedisServer) -> None:
    """A restore whose reply was lost is sent again, the same snapshot or a newer one of the same
    ledger: Redis adds what the fallback admitted once, and of a newer snapshot only what is new."""
    from limiter.redis_store import restore_call  # imported here: the test above runs without it

    twin_clock = ManualClock()
    twin = MemoryLimiter(twin_clock, instance_count=2)
    user = f"u-{uuid.uuid4().hex}"
    now_us = 10**15
    client = Redis.from_url(redis_server.url)
    restore = client.register_script(script_text("restore"))

    async def send(*, instance: str) -> int:
        snap, ledger = twin.snapshot(user, LIMITS.name), twin.ledger(user, LIMITS.name)
        keys, args = restore_call(
            user,
            LIMITS.name,
            snap,
            ledger,
            instance=instance,
            instance_count=2,
            lease_ttl_us=300 * policy.MICROS,
        )
        args = (str(now_us), *args[1:])
        await restore(keys=keys, args=args)
        return int(await client.get(user_keys(user)[0]) or 0) - now_us  # Redis's lead, in µs

    try:
        # Redis kept its data: 2 of the user's requests, admitted by the other instance.
        await client.set(user_keys(user)[0], now_us + 2 * INTERVAL_US, px=3_600_000)
        for i in range(3):
            assert twin.decide(user, f"f{i}", LIMITS, 1, 0, own=True)[0].allowed
        assert await send(instance="a") == 5 * INTERVAL_US
        assert await send(instance="a") == 5 * INTERVAL_US  # the same snapshot again: nothing more
        assert twin.decide(user, "f3", LIMITS, 1, 0, own=True)[0].allowed
        assert await send(instance="a") == 6 * INTERVAL_US  # a newer snapshot: only the new one
    finally:
        await client.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("wait_s", [0.0, 300.0])
@pytest.mark.parametrize(("before", "after"), [(1, 2), (1, 4), (2, 1), (4, 1)])
async def test_a_restore_sent_again_after_the_edge_count_changed_counts_its_ledger_once(
    redis_server: RedisServer, before: int, after: int, wait_s: float
) -> None:
    """The twin rescales its ledger when the fleet's edge count changes (MemoryLimiter.
    set_instance_count); Redis keeps the ledger's TATs as last added in the units they came in.
    A restore sent again across the change compared the two in different units: over-counted
    when the count grew, under-counted when it shrank (a review). Rescaled on Redis around the
    resend's time rather than the change's, a resend `wait_s` later over-counted again (a second
    review: 4.42 intervals for 4 at 1 -> 2 after 300 s)."""
    from limiter.redis_store import restore_call

    clock = ManualClock()
    twin = MemoryLimiter(clock, instance_count=before)
    user = f"u-{uuid.uuid4().hex}"
    now_us = 10**15
    client = Redis.from_url(redis_server.url)
    restore = client.register_script(script_text("restore"))

    async def send(instance_count: int) -> int:
        snap, ledger = twin.snapshot(user, LIMITS.name), twin.ledger(user, LIMITS.name)
        assert ledger is not None
        keys, args = restore_call(
            user,
            LIMITS.name,
            snap,
            ledger,
            instance="a",
            instance_count=instance_count,
            lease_ttl_us=300 * policy.MICROS,
        )
        await restore(keys=keys, args=(str(now_us), *args[1:]))
        twin.ledger_sent(user, LIMITS.name, ledger, landed=False)  # its answer lost: sent again
        return int(await client.get(user_keys(user)[0]) or 0) - now_us

    try:
        await client.set(user_keys(user)[0], now_us + 2 * INTERVAL_US, px=3_600_000)  # the others'
        for i in range(2):  # within a share of 4 instances (10 / 4)
            assert twin.decide(user, f"f{i}", LIMITS, 1, 0, own=True)[0].allowed
        assert await send(before) == 4 * INTERVAL_US
        twin.set_instance_count(after)
        clock.advance(wait_s)
        assert await send(after) == 4 * INTERVAL_US
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_redis_keeps_its_copy_of_a_ledger_while_a_grown_fleet_stretches_it(
    redis_server: RedisServer,
) -> None:
    """Kept for the ledger's lead at the send (720 s here), the copy expired while the twin's
    ledger, stretched by a growth to 4 edges, lived on (2,880 s): a resend then added its admits
    again (a review: 1.125 intervals for 2 already counted)."""
    from limiter.redis_store import restore_call

    twin = MemoryLimiter(ManualClock(), instance_count=1)
    user = f"u-{uuid.uuid4().hex}"
    client = Redis.from_url(redis_server.url)
    restore = client.register_script(script_text("restore"))
    try:
        for i in range(2):
            assert twin.decide(user, f"f{i}", LIMITS, 1, 0, own=True)[0].allowed
        snap, ledger = twin.snapshot(user, LIMITS.name), twin.ledger(user, LIMITS.name)
        assert ledger is not None
        keys, args = restore_call(
            user, LIMITS.name, snap, ledger, instance="a", instance_count=1, lease_ttl_us=300 * policy.MICROS
        )
        await restore(keys=keys, args=(str(10**15), *args[1:]))
        twin.ledger_sent(user, LIMITS.name, ledger, landed=False)
        twin.set_instance_count(4)
        stretched = twin.ledger(user, LIMITS.name)
        assert stretched is not None
        lead_ms = (stretched.request_tat_us - stretched.now_us) // 1000
        assert lead_ms == 4 * 2 * INTERVAL_US // 1000
        assert await client.pttl(keys[3]) > lead_ms
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_routine_restore_by_two_instances_leaves_a_redis_that_kept_its_data_as_it_was(
    redis_server: RedisServer,
) -> None:
    """No outage, nothing on a fallback: a dropped connection makes each instance restore anyway.
    Edge a admitted 5 of the user's 10, edge b 5 more half an hour later: Redis is 1,800 s ahead,
    5 left. Each twin's lead drains at half the tier's rate (its share's), so a is still 900 s
    ahead and b 1,800 s: summing them (as restore.lua once did for a Redis restarted empty) put
    Redis 2,700 s ahead and refused 3 of the user's 5; the later of them changes nothing."""
    from limiter.redis_store import restore_call

    clock = ManualClock()
    twins = {name: MemoryLimiter(clock, instance_count=2) for name in "ab"}
    user = f"u-{uuid.uuid4().hex}"
    client = Redis.from_url(redis_server.url)
    restore = client.register_script(script_text("restore"))
    try:
        for i in range(5):
            assert twins["a"].decide(user, f"a{i}", LIMITS, 1, 0)[0].allowed
        clock.advance(1800)
        for i in range(5):
            assert twins["b"].decide(user, f"b{i}", LIMITS, 1, 0)[0].allowed
        now_us = 10**15
        await client.set(user_keys(user)[0], now_us + 5 * INTERVAL_US, px=3_600_000)
        for name, twin in twins.items():
            snap = twin.snapshot(user, LIMITS.name)
            assert twin.ledger(user, LIMITS.name) is None  # Redis decided all of them
            keys, args = restore_call(
                user,
                LIMITS.name,
                snap,
                None,
                instance=name,
                instance_count=2,
                lease_ttl_us=300 * policy.MICROS,
            )
            await restore(keys=keys, args=(str(now_us), *args[1:]))
        assert int(await client.get(user_keys(user)[0])) - now_us == 5 * INTERVAL_US
    finally:
        await client.aclose()
