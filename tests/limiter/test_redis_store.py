"""The Redis store on a real redis-server: waits that are honoured, leases charged in batches,
refunds, expiring slots, and the factory's URL handling."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from limiter import policy
from limiter.base import Admission, TierLimits
from limiter.factory import create_limiter
from limiter.lease import Lease
from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.conditions import wait_until
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer


def _user() -> str:
    return f"u-{uuid.uuid4().hex}"


def _lease(admission: Admission) -> Lease:
    assert admission.decision.allowed and isinstance(admission.lease, Lease)
    return admission.lease


async def _evalsha_calls(client: Redis) -> int:
    """Script calls Redis ran (the first one of a script not yet loaded fails with NOSCRIPT)."""
    stats = (await client.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


@pytest.mark.anyio
async def test_waiting_the_advertised_retry_after_gets_the_request_in(redis_server: RedisServer) -> None:
    limiter = create_limiter("redis", redis_server.url, 1000, 1)
    assert isinstance(limiter, RedisLimiter)
    user, limits = _user(), tier(requests=2, request_window_s=1)
    try:
        assert (await limiter.admit(user, "a", limits, 1, 1)).decision.allowed
        assert (await limiter.admit(user, "b", limits, 1, 1)).decision.allowed
        denied = (await limiter.admit(user, "c", limits, 1, 1)).decision
        assert not denied.allowed and denied.limit == "requests"
        assert 0 < denied.retry_after_ms <= 500  # one interval of a 2-per-second limit, not 1 s
        # Waiting is the behaviour under test here: the client does exactly what Retry-After says.
        await asyncio.sleep(denied.retry_after_ms / 1000)
        assert (await limiter.admit(user, "c", limits, 1, 1)).decision.allowed
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_lease_charges_redis_once_per_batch_and_stops_at_the_budget(redis_server: RedisServer) -> None:
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, batch_tokens=32)
    probe = Redis.from_url(redis_server.url)
    user, limits = _user(), tier(tokens=1000, token_window_s=86400)
    try:
        lease = _lease(await limiter.admit(user, "r", limits, 100, 4096))
        before = await _evalsha_calls(probe)
        taken = 0
        while (got := await lease.take(1)) == 1:
            taken += 1
        assert got == 0 and taken == 900  # input 100 + output 900 = the whole budget
        calls = await _evalsha_calls(probe) - before
        # One charge per batch, not one per token: batches of 64, 128 and 256, then the budget's
        # last 420 of the 512 asked, and one that finds nothing left (the budget may have held more
        # by then: test_a_stream_given_short_asks_again_for_what_the_users_other_stream_gave_back).
        assert calls == 5
        await lease.settle()
        assert not (await limiter.admit(user, "next", limits, 1, 0)).decision.allowed
    finally:
        await probe.aclose()
        await limiter.aclose()


@pytest.mark.anyio
async def test_take_returns_fewer_than_asked_when_the_budget_runs_out(redis_server: RedisServer) -> None:
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, batch_tokens=32)
    user, limits = _user(), tier(tokens=100, token_window_s=86400)
    try:
        lease = _lease(await limiter.admit(user, "r", limits, 60, 4096))
        assert await lease.take(30) == 30
        assert await lease.take(30) == 10
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_stream_given_short_asks_again_for_what_the_users_other_stream_gave_back(
    redis_server: RedisServer,
) -> None:
    """A short grant is what the budget held then, not its end: one stream of the user got the 36
    tokens left beside another stream's lease of 32; that one then ended after 2 tokens, refunding
    30. The first stream, once its grant was used, was stopped as if the budget were spent (its
    lease took a short grant for the budget's end and never asked again): "limit_reached" with 30
    tokens left."""
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, batch_tokens=32)
    user, limits = _user(), tier(tokens=100, token_window_s=86400)
    try:
        long = _lease(await limiter.admit(user, "long", limits, 0, 4096))
        short = _lease(await limiter.admit(user, "short", limits, 0, 4096))
        taken = 0
        while taken < 68 and await long.take(1) == 1:
            taken += 1
        assert taken == 68 and long.granted == 68  # its lease of 32, then the 36 left of 64 asked
        assert await short.take(2) == 2
        await short.settle()  # ended early: 30 of its lease back
        assert await long.take(30) == 30
        assert await long.take(1) == 0  # now the budget is spent
        await long.settle()
        assert (await limiter.admit(user, "probe", limits, 0, 0)).decision.remaining_tokens == 0
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_settle_gives_the_unused_lease_back_once(redis_server: RedisServer) -> None:
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, batch_tokens=64)
    user, limits = _user(), tier(tokens=1000, token_window_s=86400)
    try:
        lease = _lease(await limiter.admit(user, "r", limits, 100, 4096))
        assert await lease.take(10) == 10
        during = (await limiter.admit(user, "probe1", limits, 0, 0)).decision
        assert during.remaining_tokens == 1000 - 100 - 64
        await lease.settle()
        await lease.settle()
        await limiter.settle(user, limits, "r", 54)  # a duplicate from another path refunds nothing
        after = (await limiter.admit(user, "probe2", limits, 0, 0)).decision
        # Refill over the test's few milliseconds of a 1-day window is far below one token.
        assert after.remaining_tokens == 1000 - 100 - 10
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_request_that_never_ran_is_uncounted(redis_server: RedisServer) -> None:
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, batch_tokens=32)
    user, limits = _user(), tier(requests=1, request_window_s=3600, tokens=1000, token_window_s=86400)
    try:
        await _lease(await limiter.admit(user, "queue-full", limits, 300, 500)).settle(ran=False)
        again = (await limiter.admit(user, "again", limits, 0, 0)).decision
        assert again.allowed and again.remaining_tokens == 1000
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_slot_whose_edge_died_expires_with_its_lease_ttl(redis_server: RedisServer) -> None:
    now_us = 10**12
    limiter = RedisLimiter.from_url(
        redis_server.url, timeout_ms=1000, lease_ttl_s=120, now_override_us=lambda: now_us
    )
    user, limits = _user(), tier(concurrent=1)
    try:
        _lease(await limiter.admit(user, "crashed", limits, 1, 1))  # never settled
        denied = (await limiter.admit(user, "b", limits, 1, 1)).decision
        assert not denied.allowed and denied.limit == "concurrency"
        now_us += 120 * policy.MICROS
        assert (await limiter.admit(user, "b", limits, 1, 1)).decision.allowed
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_the_slots_of_a_departed_edge_free_when_they_would_refuse(redis_server: RedisServer) -> None:
    """Slots whose request ids carry a departed holder's prefix go when the user's slots are full;
    a live holder's stay, and so do a departed one's while there is room (they cost nothing)."""
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, lease_ttl_s=300)
    probe = Redis.from_url(redis_server.url)
    user, limits = _user(), tier(concurrent=3)
    conc = user_keys(user)[2]
    try:
        for request_id in ("chatcmpl-deadbeef01", "chatcmpl-deadbeef02", "chatcmpl-11ve000003"):
            _lease(await limiter.admit(user, request_id, limits, 1, 1))  # never settled
        limiter.free_slots_of(["chatcmpl-0ther000"])  # another departed edge: not this user's
        denied = (await limiter.admit(user, "chatcmpl-11ve000004", limits, 1, 1)).decision
        assert not denied.allowed and denied.limit == "concurrency"

        limiter.free_slots_of(["chatcmpl-0ther000", "chatcmpl-deadbeef"])
        assert (await limiter.admit(user, "chatcmpl-11ve000004", limits, 1, 1)).decision.allowed
        held = sorted(m.decode() for m in await probe.zrange(conc, 0, -1))
        assert held == ["chatcmpl-11ve000003", "chatcmpl-11ve000004"]

        # Room left: nothing is scanned or freed (a departed holder's slot there costs nobody).
        other, wide = _user(), tier(concurrent=3)
        _lease(await limiter.admit(other, "chatcmpl-deadbeef05", wide, 1, 1))
        assert (await limiter.admit(other, "chatcmpl-11ve000006", wide, 1, 1)).decision.allowed
        assert await probe.zscore(user_keys(other)[2], "chatcmpl-deadbeef05") is not None
    finally:
        await limiter.aclose()
        await probe.aclose()


@pytest.mark.anyio
async def test_an_edge_back_from_a_stall_puts_its_running_requests_slots_back(
    redis_server: RedisServer,
) -> None:
    """Counted out while stalled, an edge's running request lost its slot to another edge's admit
    (freed as a dead edge's). Back in the fleet (restore_slots), the slot is put back before its
    next admit: the user is at their limit again, and the request's settle refunds its lease."""
    stalled = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, lease_ttl_s=300)
    other = RedisLimiter.from_url(redis_server.url, timeout_ms=1000, lease_ttl_s=300)
    probe = Redis.from_url(redis_server.url)
    user, limits = _user(), tier(concurrent=1, tokens=10_000, token_window_s=86400)
    tokens_key = user_keys(user)[1]
    try:
        running = _lease(await stalled.admit(user, "chatcmpl-aaaa1111x1", limits, 10, 500))
        other.free_slots_of(["chatcmpl-aaaa1111"])  # the fleet counted the stalled edge out
        await _lease(await other.admit(user, "chatcmpl-bbbb2222x1", limits, 1, 1)).settle()
        other.free_slots_of([])  # ... and sees it beat again

        stalled.restore_slots()

        async def slot_back() -> bool:
            return await probe.zscore(user_keys(user)[2], "chatcmpl-aaaa1111x1") is not None

        # Put back in the background: an admit of another user no longer waits for it.
        await wait_until("the running request's slot back on Redis", slot_back)
        denied = (await other.admit(user, "chatcmpl-bbbb2222x2", limits, 1, 1)).decision
        assert not denied.allowed and denied.limit == "concurrency"

        before = int(await probe.get(tokens_key) or 0)
        assert running.granted > running.used
        await running.settle()
        assert int(await probe.get(tokens_key) or 0) < before  # the unused lease came back
        assert (await other.admit(user, "chatcmpl-bbbb2222x3", limits, 1, 1)).decision.allowed
    finally:
        await stalled.aclose()
        await other.aclose()
        await probe.aclose()


class _Announcing:
    """The limiter as a lease's store, saying when an extension has been asked for."""

    def __init__(self, limiter: RedisLimiter) -> None:
        self.limiter = limiter
        self.asked = asyncio.Event()

    async def charge(self, user: str, tier: TierLimits, request_id: str, want: int) -> int:
        self.asked.set()
        return await self.limiter.charge(user, tier, request_id, want)

    async def settle(
        self,
        user: str,
        tier: TierLimits,
        request_id: str,
        refund: int,
        *,
        refund_request: bool = False,
        cancelled: bool = False,
    ) -> bool | None:
        return await self.limiter.settle(
            user, tier, request_id, refund, refund_request=refund_request, cancelled=cancelled
        )


@pytest.mark.anyio
async def test_a_stream_cut_while_its_lease_extends_is_refunded_the_extension(
    redis_server: RedisServer,
) -> None:
    """The stream is cancelled (a cancel, a disconnect) while the extension's answer is held up (a
    paused Redis): the store grants it all the same, and the settle refunds it. Two users use the
    same lease; the cut one used a token less, so it has at least as many left."""
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=5000, batch_tokens=32)
    probe = Redis.from_url(redis_server.url)
    limits = tier(tokens=100_000, token_window_s=86400)
    left: dict[str, int] = {}
    try:
        for name, cut in (("whole", False), ("cut", True)):
            user = _user()
            admitted = _lease(await limiter.admit(user, f"{name}-1", limits, 10, 500))
            store = _Announcing(limiter)
            lease = Lease(
                store,
                user,
                limits,
                f"{name}-1",
                input_tokens=10,
                granted=admitted.granted,
                max_output_tokens=500,
                batch_tokens=32,
                slot_ttl_s=300,
            )
            assert lease.try_take(lease.granted) == admitted.granted  # the first batch, all used
            if cut:
                await probe.execute_command("CLIENT", "PAUSE", "300", "ALL")
                extending = asyncio.ensure_future(lease.take(1))
                await store.asked.wait()
                extending.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await extending
            else:
                assert await lease.take(1) == 1
            await lease.settle()
            decision = (await limiter.admit(user, f"{name}-2", limits, 1, 1)).decision
            left[name] = decision.remaining_tokens
        assert left["cut"] >= left["whole"], left
    finally:
        await limiter.aclose()
        await probe.aclose()


@pytest.mark.anyio
async def test_keys_carry_the_user_hash_tag_and_expire(redis_server: RedisServer) -> None:
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=1000)
    probe = Redis.from_url(redis_server.url)
    user = _user()
    try:
        _lease(await limiter.admit(user, "r", tier(request_window_s=60, token_window_s=600), 10, 10))
        for key in user_keys(user):
            assert f"{{{user}}}" in key
            ttl_ms = await probe.pttl(key)
            assert 0 < ttl_ms <= 600_000 + 300_000 + 1000
    finally:
        await probe.aclose()
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_tier_budget_new_on_redis_starts_from_the_budget_kept_before_budgets_were_per_tier(
    redis_server: RedisServer,
) -> None:
    """An edge of the release before per-tier budgets kept one budget per user (no tier in its key
    names): the first admit in a named tier starts from it, so the deploy does not give every user
    a whole window afresh, and a user with nothing kept starts full. Another tier the user moves to
    does not: what was spent before was spent in the first, and read in another tier's units it
    throttled the move (a free user that spent its day, moved to paid, refused with 17 of 2M tokens
    left)."""
    store = RedisLimiter.from_url(redis_server.url, timeout_ms=1000)
    probe = Redis.from_url(redis_server.url)
    limits = tier(tokens=1_000, token_window_s=86400, name="free")
    other = tier(tokens=100_000, token_window_s=86400, name="paid")
    spent, fresh = _user(), _user()
    try:
        # What the release before wrote for a user that spent 900 of its 1,000 tokens today.
        now_us = int((await probe.time())[0]) * policy.MICROS
        await probe.set(user_keys(spent)[1], now_us + 900 * 86400 * policy.MICROS // 1_000, px=86_400_000)
        kept = (await store.admit(spent, "chatcmpl-cccc3333x1", limits, 10, 0)).decision
        assert kept.allowed and 85 <= kept.remaining_tokens <= 90
        assert not (await store.admit(spent, "chatcmpl-cccc3333x2", limits, 200, 0)).decision.allowed
        full = (await store.admit(fresh, "chatcmpl-cccc3333x3", limits, 10, 0)).decision
        assert full.allowed and full.remaining_tokens == 990
        moved = (await store.admit(spent, "chatcmpl-cccc3333x4", other, 10, 0)).decision
        assert moved.allowed and moved.remaining_tokens == 99_990
    finally:
        await store.aclose()
        await probe.aclose()
