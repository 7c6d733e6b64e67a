"""A slow Redis is not a dead one: a burst against a store that answers late must never admit
more than the tier allows, and every slot a late-running script took must be freed again.

Redis is slowed with `DEBUG SLEEP` (it answers nothing meanwhile, then runs every command that
queued up): the limiter's calls time out while their scripts still run afterwards, the exact
situation where an empty fallback and redis-py's own retries used to double-count.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from structlog.testing import capture_logs

from limiter.base import Admission
from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.conditions import WAIT_S, wait_until
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer, start_redis

BURST = 150
LIMIT = 5


@pytest.fixture
def debug_redis() -> Iterator[RedisServer]:
    """A server of this test's own that accepts DEBUG SLEEP from loopback."""
    server = start_redis(extra_args=["--enable-debug-command", "local"])
    yield server
    server.kill()


async def _stall(probe: Redis, seconds: float) -> asyncio.Task[object]:
    """Start `DEBUG SLEEP` and return once Redis is inside it (a PING on another connection then
    goes unanswered): the calls fired next certainly meet a stalled server."""
    stall = asyncio.create_task(probe.execute_command("DEBUG", "SLEEP", str(seconds)))  # type: ignore[no-untyped-call]
    port = probe.connection_pool.connection_kwargs["port"]
    # No retries: redis-py's default retry would wait the stall out and hide it.
    other = Redis(port=port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))
    try:

        async def stalled() -> bool:
            try:
                await other.ping()
            except Exception:
                return True
            return False

        await wait_until("Redis inside DEBUG SLEEP", stalled)
        return stall
    finally:
        await other.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("on_store_failure", ["open", "closed"])
async def test_a_burst_against_a_stalled_redis_right_after_start_never_over_admits(
    debug_redis: RedisServer, on_store_failure: str
) -> None:
    limits = tier(requests=LIMIT, request_window_s=3600, on_store_failure=on_store_failure)
    user = f"burst-{uuid.uuid4().hex}"
    probe = Redis.from_url(debug_redis.url)
    # A fresh limiter: no connection open, no script loaded yet. A short answer bound, so that
    # the stall certainly outlasts it.
    limiter = RedisLimiter.from_url(debug_redis.url, timeout_ms=100, backoff_s=0.05)
    try:
        stall = await _stall(probe, 0.5)

        async def one(i: int) -> Admission | None:
            try:
                return await limiter.admit(user, f"b{i}", limits, 1, 0)
            except Exception:  # StoreUnavailable for the fail-closed tier: refused, not admitted
                return None

        answers = await asyncio.gather(*(one(i) for i in range(BURST)))
        await stall
        admitted = [a for a in answers if a is not None and a.decision.allowed]
        assert len(admitted) <= LIMIT  # over-admission 0

        # Every request ends; afterwards no slot is left on Redis, whatever ran late there.
        for admission in admitted:
            assert admission.lease is not None
            await admission.lease.settle()

        async def no_slots_left() -> bool:
            return limiter.pending_settles == 0 and await probe.zcard(user_keys(user)[2]) == 0

        await wait_until("all slots freed on Redis", no_slots_left)
    finally:
        await limiter.aclose()
        await probe.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(("instances", "more_on_fallback"), [(1, 2), (2, 0)])
async def test_the_fallback_continues_from_what_this_instance_admitted_on_redis(
    debug_redis: RedisServer, instances: int, more_on_fallback: int
) -> None:
    """The fallback used to start from an empty state: a tier of 5 with 3 already admitted on
    Redis got 5 more once Redis failed. It continues from this instance's own count instead, and
    never goes past its share (5 // instances) of the tier."""
    limits = tier(requests=LIMIT, request_window_s=3600, on_store_failure="open")
    user = f"continue-{uuid.uuid4().hex}"
    limiter = RedisLimiter.from_url(debug_redis.url, timeout_ms=200, instance_count=instances, backoff_s=60)
    try:
        on_redis = [await limiter.admit(user, f"r{i}", limits, 1, 0) for i in range(3)]
        assert all(a.decision.allowed for a in on_redis) and not limiter.fallback_active
        debug_redis.kill()
        on_fallback = [(await limiter.admit(user, f"f{i}", limits, 1, 0)).decision.allowed for i in range(5)]
        assert limiter.fallback_active
        assert on_fallback == [True] * more_on_fallback + [False] * (5 - more_on_fallback)
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_fallback_admit_for_want_of_a_free_connection_puts_back_only_what_it_counted(
    debug_redis: RedisServer,
) -> None:
    """A busy pool is not a lost Redis: Redis kept everything but the one request the fallback
    admitted meanwhile. The restore that followed sent every user the twin held (20 here, 30,000
    on a busy edge, while that pool was still busy) as after an outage."""
    limits = tier(requests=100, request_window_s=3600, on_store_failure="open")
    tag = uuid.uuid4().hex
    others = [f"pool-{tag}-{i}" for i in range(20)]
    busy_user = f"pool-{tag}-busy"
    # One connection, a short wait for it, and a generous answer bound: the stall below makes the
    # connection busy, never the store failed.
    limiter = RedisLimiter.from_url(
        debug_redis.url, timeout_ms=10_000, max_connections=1, pool_wait_s=0.05, backoff_s=60
    )
    probe = Redis.from_url(debug_redis.url)
    try:
        for user in others:
            assert (await limiter.admit(user, "r", limits, 1, 0)).decision.allowed
        stall = await _stall(probe, 1)
        holding = asyncio.create_task(limiter.admit(others[0], "held", limits, 1, 0))

        async def connection_taken() -> bool:
            return limiter._in_flight.locked()

        await wait_until("the one connection taken", connection_taken)
        with capture_logs() as logs:
            busy = await limiter.admit(busy_user, "b", limits, 1, 0)  # no free connection: the fallback
            assert busy.decision.allowed and not limiter.fallback_active
            assert (await holding).decision.allowed
            await stall

            async def restored() -> bool:
                return limiter._restoring is not None and limiter._restoring.done()

            await wait_until("the restore after the fallback's admit", restored)
        assert not limiter.fallback_active
        assert [e["budgets"] for e in logs if e["event"] == "limiter_restored"] == [1]
        request_key, _, slots_key = user_keys(busy_user)
        assert await probe.get(request_key) is not None
        assert await probe.zscore(slots_key, "b") is not None
    finally:
        await limiter.aclose()
        await probe.aclose()


@pytest.mark.anyio
async def test_a_charge_granted_for_want_of_a_free_connection_reaches_redis(
    redis_server: RedisServer,
) -> None:
    """A charge that found no free connection within pool_wait_s is granted from this instance's
    share (fail-open) and counted in the user's ledger, but nothing marked Redis as lacking it: no
    restore followed, and Redis admitted the user's next request on a token budget it believed
    untouched."""
    limits = tier(tokens=100, token_window_s=3600, on_store_failure="open")
    user = f"pool-charge-{uuid.uuid4().hex}"
    limiter = RedisLimiter.from_url(
        redis_server.url, timeout_ms=10_000, max_connections=1, pool_wait_s=0.05, backoff_s=60
    )
    try:
        assert (await limiter.admit(user, "r1", limits, 10, 0)).decision.allowed
        await limiter._in_flight.acquire()  # the one connection busy: the charge waits, then falls back
        try:
            granted = await limiter.charge(user, limits, "r1", 80)
        finally:
            limiter._in_flight.release()
        assert granted == 80 and not limiter.fallback_active
        await limiter.settle(user, limits, "r1", 0)
        # 90 of the 100 tokens are spent: a 50-token prompt does not fit.
        refused = (await limiter.admit(user, "r2", limits, 50, 0)).decision
        assert not refused.allowed and refused.limit == "tokens", refused
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_request_settled_while_its_restore_is_in_flight_is_refunded_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback admitted two requests for want of a free connection; the restore that put their
    ledger back ran on Redis, and before its answer came one of them was settled as never run: the
    ledger refunded it, and so did Redis, whose slot of it the restore had just put back. The
    ledger's kept copy on Redis was past its refunded count then, so the next request the fallback
    admitted in that ledger added nothing there: beside another edge's two, Redis admitted a
    seventh request of six."""
    limits = tier(requests=6, request_window_s=3600, on_store_failure="open")
    user = f"pool-settle-{uuid.uuid4().hex}"
    limiter, other = (
        RedisLimiter.from_url(
            redis_server.url,
            timeout_ms=10_000,
            instance_count=2,
            max_connections=2,
            pool_wait_s=0.05,
            backoff_s=60,
        )
        for _ in range(2)
    )
    answered, answer = asyncio.Event(), asyncio.Event()  # the first restore: ran, its answer held
    built, send = asyncio.Event(), asyncio.Event()  # the second: built, held before it is sent
    send_all = limiter._send_all
    restores = 0

    async def holding_restores(script: object, calls: list[object]) -> object:
        nonlocal restores
        if script is not limiter._restore:
            return await send_all(script, calls)  # type: ignore[arg-type]
        restores += 1
        if restores == 2:
            built.set()
            await send.wait()
        reply = await send_all(script, calls)  # type: ignore[arg-type]
        if restores == 1:
            answered.set()
            await answer.wait()
        return reply

    monkeypatch.setattr(limiter, "_send_all", holding_restores)

    async def fallback_admit(request_id: str, permits: int) -> Admission:
        for _ in range(permits):  # every connection busy: the fallback answers
            await limiter._in_flight.acquire()
        try:
            return await limiter.admit(user, request_id, limits, 1, 0)
        finally:
            for _ in range(permits):
                limiter._in_flight.release()

    try:
        for request_id in ("b1", "b2"):  # the other edge's, on Redis
            assert (await other.admit(user, request_id, limits, 1, 0)).decision.allowed
        assert (await fallback_admit("r0", 2)).decision.allowed
        assert (await fallback_admit("r1", 2)).decision.allowed
        second = asyncio.create_task(limiter.admit(user, "a2", limits, 1, 0))
        await asyncio.wait_for(answered.wait(), WAIT_S)
        await limiter.settle(user, limits, "r1", 0, refund_request=True)  # lands beside its slot
        answer.set()
        assert (await second).decision.allowed
        await asyncio.wait_for(built.wait(), WAIT_S)
        assert (await fallback_admit("r3", 1)).decision.allowed  # b1, b2, r0, a2, r3
        send.set()
        restoring = limiter._restoring
        assert restoring is not None
        await restoring
        assert (await limiter.admit(user, "a4", limits, 1, 0)).decision.allowed  # the sixth
        seventh = (await limiter.admit(user, "a5", limits, 1, 0)).decision
        assert not seventh.allowed and seventh.limit == "requests", seventh
    finally:
        answer.set()
        send.set()
        await limiter.aclose()
        await other.aclose()


@pytest.mark.anyio
async def test_a_request_settled_after_a_restore_that_was_never_sent_is_refunded(
    redis_server: RedisServer,
) -> None:
    """A restore that found no free connection (never sent) left the requests of the ledger it
    built marked as on their way to Redis (_Ledger.sending), for good: a settle of one of them then
    refunded it neither in the ledger (Redis might hold it) nor on Redis (which never did), and the
    next restore put back a request its settle had refunded: Redis refused the user's third of
    three, with two counted."""
    limits = tier(requests=3, request_window_s=3600, on_store_failure="open")
    user = f"pool-unsent-{uuid.uuid4().hex}"
    limiter = RedisLimiter.from_url(
        redis_server.url, timeout_ms=10_000, max_connections=1, pool_wait_s=0.05, backoff_s=60
    )

    async def pool_busy_admit(request_id: str) -> Admission:
        await limiter._in_flight.acquire()  # the one connection busy: the fallback answers
        try:
            return await limiter.admit(user, request_id, limits, 1, 0)
        finally:
            limiter._in_flight.release()

    try:
        assert (await pool_busy_admit("r0")).decision.allowed
        # Its restore of r0's ledger waits for a connection, is never sent, and the fallback answers.
        assert (await pool_busy_admit("r1")).decision.allowed
        await limiter.settle(user, limits, "r0", 0, refund_request=True)  # never ran: not counted
        assert (await limiter.admit(user, "a2", limits, 1, 0)).decision.allowed  # r1, a2
        third = (await limiter.admit(user, "a3", limits, 1, 0)).decision
        assert third.allowed, third
        assert not limiter.fallback_active
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_request_settled_while_its_restore_waits_for_a_connection_is_refunded(
    redis_server: RedisServer,
) -> None:
    """A request the fallback admitted was settled as never run while a restore carrying its ledger
    waited for a free connection, which it never got (not sent): the settle left the ledger's count
    alone, as for a restore that may have run, and the restore's failure did not give it back. The
    next restore put the request back on Redis, counted for good: Redis refused the user's third
    request of three with two counted."""
    limits = tier(requests=3, request_window_s=3600, on_store_failure="open")
    user = f"pool-waiting-{uuid.uuid4().hex}"
    # A wait long beside the few passes of the loop the settle below takes to come.
    limiter = RedisLimiter.from_url(
        redis_server.url, timeout_ms=10_000, max_connections=1, pool_wait_s=0.5, backoff_s=60
    )
    try:
        await limiter._in_flight.acquire()  # the one connection busy: the fallback answers
        try:
            assert (await limiter.admit(user, "r0", limits, 1, 0)).decision.allowed
            second = asyncio.create_task(limiter.admit(user, "r1", limits, 1, 0))
            ledger = limiter._local._ledgers[user, limits.name]

            async def carried() -> bool:  # r1's restore of r0's ledger waits for the connection
                return "r0" in ledger.sending

            await wait_until("r1's restore carries r0", carried)
            await limiter.settle(user, limits, "r0", 0, refund_request=True)  # never ran: not counted
            assert (await second).decision.allowed  # its restore never sent: the fallback's
        finally:
            limiter._in_flight.release()
        assert (await limiter.admit(user, "a2", limits, 1, 0)).decision.allowed  # r1, a2
        third = (await limiter.admit(user, "a3", limits, 1, 0)).decision
        assert third.allowed, third
        assert not limiter.fallback_active
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_a_request_settled_after_its_restore_was_called_off_unsent_is_refunded(
    redis_server: RedisServer,
) -> None:
    """An admit whose caller left (its client hung up) while its own restore waited for a free
    connection was taken as a restore that may have run: the ledger let go of the requests it
    carried, though nothing had been sent. A settle of one of them then refunded it neither in the
    ledger nor on Redis (which never held it), and the next restore counted it for good: Redis
    refused the user's third request of three with two counted."""
    limits = tier(requests=3, request_window_s=3600, on_store_failure="open")
    user = f"pool-called-off-{uuid.uuid4().hex}"
    limiter = RedisLimiter.from_url(
        redis_server.url, timeout_ms=10_000, max_connections=1, pool_wait_s=0.05, backoff_s=60
    )
    try:
        await limiter._in_flight.acquire()  # the one connection busy: the fallback answers
        try:
            assert (await limiter.admit(user, "r0", limits, 1, 0)).decision.allowed
            limiter._pool_wait_s = WAIT_S  # the next restore waits until its caller leaves
            leaving = asyncio.create_task(limiter.admit(user, "r1", limits, 1, 0))
            ledger = limiter._local._ledgers[user, limits.name]

            async def carried() -> bool:  # r1's restore of r0's ledger waits for the connection
                return "r0" in ledger.sending

            await wait_until("r1's restore carries r0", carried)
            leaving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await leaving
            limiter._pool_wait_s = 0.05
            await limiter.settle(user, limits, "r0", 0, refund_request=True)  # never ran: not counted
        finally:
            limiter._in_flight.release()
        for request_id in ("a2", "a3"):
            assert (await limiter.admit(user, request_id, limits, 1, 0)).decision.allowed
        third = (await limiter.admit(user, "a4", limits, 1, 0)).decision
        assert third.allowed, third
        assert not limiter.fallback_active
    finally:
        await limiter.aclose()
