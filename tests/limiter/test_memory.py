"""The in-memory twin: the algorithm's behaviour, on an injected clock."""

from __future__ import annotations

import pytest

from limiter import policy
from limiter.base import Admission, Limiter
from limiter.factory import create_limiter
from limiter.memory import MemoryLimiter
from tests.limiter.clock import ManualClock
from tests.limiter.tiers import tier


def _lease(admission: Admission):  # type: ignore[no-untyped-def]
    assert admission.decision.allowed and admission.lease is not None
    return admission.lease


@pytest.mark.anyio
async def test_factory_builds_the_twin_that_satisfies_the_protocol() -> None:
    limiter: Limiter = create_limiter("memory", "", 250, 1, clock=ManualClock())
    assert isinstance(limiter, MemoryLimiter)
    with pytest.raises(ValueError, match="unknown limiter backend"):
        create_limiter("etcd", "", 250, 1)


@pytest.mark.anyio
async def test_each_of_several_memory_instances_enforces_its_share() -> None:
    limiter = create_limiter("memory", "", 250, 2, clock=ManualClock())
    t = tier(requests=10, request_window_s=3600)
    allowed = [(await limiter.admit("u", f"r{i}", t, 1, 0)).decision for i in range(6)]
    assert [d.allowed for d in allowed] == [True] * 5 + [False]
    assert allowed[0].limit_requests == 5  # the headers tell what this instance enforces


@pytest.mark.anyio
async def test_a_prompt_bigger_than_one_instances_share_waits_for_an_untouched_share_only() -> None:
    """The tier's 40,000 tokens hold a 25,000-token prompt (the edge lets it through); one of two
    instances' share does not. It is charged the whole share on a share untouched, not refused
    for good (a 6 h Retry-After, then the same again)."""
    clock = ManualClock()
    limiter = MemoryLimiter(clock, instance_count=2)
    limits = tier(tokens=40_000, token_window_s=86_400)
    assert (await limiter.admit("u", "first", limits, 25_000, 100)).decision.allowed
    again = (await limiter.admit("u", "second", limits, 25_000, 100)).decision
    assert not again.allowed and again.limit == "tokens"
    clock.advance(again.retry_after_ms / 1000)
    assert (await limiter.admit("u", "second", limits, 25_000, 100)).decision.allowed


@pytest.mark.anyio
async def test_burst_is_the_limit_then_one_per_interval_no_edge_double_burst() -> None:
    clock = ManualClock()
    limiter = MemoryLimiter(clock)
    t = tier(requests=20, request_window_s=10800)
    allowed = [(await limiter.admit("u", f"r{i}", t, 1, 1)).decision.allowed for i in range(25)]
    assert allowed == [True] * 20 + [False] * 5
    # Past the "window edge" of a fixed-window limiter the quota does not come back whole:
    # 3 h / 20 = 540 s earns exactly one request.
    clock.advance(540)
    allowed = [(await limiter.admit("u", f"s{i}", t, 1, 1)).decision.allowed for i in range(3)]
    assert allowed == [True, False, False]


@pytest.mark.anyio
async def test_retry_after_the_advertised_wait_is_admitted_and_not_a_moment_earlier() -> None:
    clock = ManualClock()
    limiter = MemoryLimiter(clock)
    t = tier(requests=3, request_window_s=60)
    for i in range(3):
        assert (await limiter.admit("u", f"r{i}", t, 1, 1)).decision.allowed
    denied = (await limiter.admit("u", "late", t, 1, 1)).decision
    assert not denied.allowed and denied.limit == "requests"
    assert denied.retry_after_ms == 20_000  # one interval, not the whole 60 s window
    assert denied.remaining_requests == 0 and denied.reset_requests_ms == 60_000
    clock.advance(denied.retry_after_ms / 1000 - 0.001)
    assert not (await limiter.admit("u", "early", t, 1, 1)).decision.allowed
    clock.advance(0.001)
    assert (await limiter.admit("u", "late", t, 1, 1)).decision.allowed


@pytest.mark.anyio
async def test_tokens_debit_input_and_the_initial_lease_and_report_the_binding_limit() -> None:
    clock = ManualClock()
    limiter = MemoryLimiter(clock, batch_tokens=32)
    t = tier(tokens=1000, token_window_s=100)  # 0.1 s per token
    first = (await limiter.admit("u", "a", t, 900, 500)).decision
    assert first.allowed and first.remaining_tokens == 1000 - 900 - 32
    # The server's own max_tokens (the client asked for none): the wait is for the lease,
    # 932 + 132 = 1064 tokens, 64 over at 0.1 s each.
    left_out = (await limiter.admit("u", "b", t, 100, 500)).decision
    assert not left_out.allowed and left_out.limit == "tokens" and left_out.retry_after_ms == 6_400
    # Asked for by name: told to wait until its whole reply fits, 932 + 100 + 500 = 1532, 532 over.
    denied = (await limiter.admit("u", "b", t, 100, 500, asked_output_tokens=500)).decision
    assert denied.retry_after_ms == 53_200 and denied.token_wait_ms == 53_200
    # Its lease (932 + 132 = 1064, 64 over) fits sooner: sent then, it is admitted all the same, and
    # the budget stops its reply.
    clock.advance(6.4)
    early = (await limiter.admit("u", "b", t, 100, 500)).decision
    assert early.allowed and early.remaining_tokens == 0


def _counting(limiter: MemoryLimiter) -> list[int]:
    """Every charge's `want`, in order."""
    wants: list[int] = []
    charge = limiter.charge

    async def counting_charge(user, tier, request_id, want):  # type: ignore[no-untyped-def]
        wants.append(want)
        return await charge(user, tier, request_id, want)

    limiter.charge = counting_charge  # type: ignore[method-assign]
    return wants


@pytest.mark.anyio
async def test_lease_takes_locally_charges_in_batches_and_stops_at_the_budget() -> None:
    clock = ManualClock()
    limiter = MemoryLimiter(clock, batch_tokens=32)
    wants = _counting(limiter)
    t = tier(tokens=500, token_window_s=1000)
    lease = _lease(await limiter.admit("u", "r", t, 100, 1000))
    taken = [await lease.take(1) for _ in range(400)]
    assert taken == [1] * 400  # 100 input + 400 output = the whole budget
    # One store call per batch, not per token: batches of 64 and 128, then 256 asked of a budget
    # with 176 left.
    assert wants == [64, 128, 256]
    assert await lease.take(1) == 0  # budget spent: the edge stops with "length"
    await lease.settle()
    assert not (await limiter.admit("u", "next", t, 1, 1)).decision.allowed


@pytest.mark.anyio
async def test_a_fast_streams_batch_doubles_to_the_cap_and_reserves_ahead_no_more_than_it_used() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=32)
    wants = _counting(limiter)
    lease = _lease(await limiter.admit("u", "r", tier(tokens=10**6, token_window_s=1000), 10, 5000))
    for _ in range(5000):
        assert await lease.take(1) == 1
        # Never more ahead of its use than it has used, beyond the first batch.
        assert lease.granted - lease.used <= lease.used + 32
    assert wants == [64, 128, 256, 512, 512, 512, 512, 512, 512, 512, 512, 424]
    assert sum(wants[:6]) + 32 >= 2000  # a 2,000-token reply: 6 store calls after its admission


@pytest.mark.anyio
async def test_a_slow_streams_batch_stays_small_so_its_charges_keep_its_slot_alive() -> None:
    clock = ManualClock()
    # Each batch lasts 1.25 s, a 64th of the slot's TTL: doubled, the next would take a 32nd.
    limiter = MemoryLimiter(clock, batch_tokens=32, lease_ttl_s=80)
    wants = _counting(limiter)
    t = tier(tokens=10**6, token_window_s=1000, concurrent=1)
    lease = _lease(await limiter.admit("u", "r", t, 10, 320))
    for i in range(320):
        if i and i % 32 == 0:
            clock.advance(1.25)
        assert await lease.take(1) == 1
    assert wants == [32] * 9
    assert not (await limiter.admit("u", "second", t, 1, 1)).decision.allowed  # its slot held throughout


@pytest.mark.anyio
async def test_a_stream_that_slows_down_shrinks_its_batch_back_to_the_first() -> None:
    clock = ManualClock()
    limiter = MemoryLimiter(clock, batch_tokens=32, lease_ttl_s=80)
    wants = _counting(limiter)
    t = tier(tokens=10**6, token_window_s=1000, concurrent=1)
    lease = _lease(await limiter.admit("u", "r", t, 10, 10**5))
    while len(wants) < 3:  # fast: 64, 128, 256
        assert await lease.take(1) == 1
    for _ in range(4):  # then each batch takes 6 s, over a 16th of the TTL
        clock.advance(6)
        assert await lease.take(lease.granted - lease.used + 1) >= 1
    assert wants == [64, 128, 256, 128, 64, 32, 32]
    assert not (await limiter.admit("u", "second", t, 1, 1)).decision.allowed  # its slot held throughout


@pytest.mark.anyio
async def test_take_returns_fewer_than_asked_when_the_budget_runs_out_mid_batch() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=32)
    t = tier(tokens=100, token_window_s=1000)
    lease = _lease(await limiter.admit("u", "r", t, 60, 1000))
    assert await lease.take(30) == 30
    assert await lease.take(30) == 10  # 60 + 40 = 100: ten of the thirty are covered


@pytest.mark.anyio
async def test_settle_refunds_the_unused_lease_and_is_idempotent() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=64)
    t = tier(tokens=1000, token_window_s=1000)
    lease = _lease(await limiter.admit("u", "r", t, 100, 1000))
    assert await lease.take(10) == 10
    await lease.settle()
    await lease.settle()
    await limiter.settle("u", t, "r", 54)  # a stray second settle from the store side
    after = (await limiter.admit("u", "s", t, 0, 1)).decision
    assert after.remaining_tokens == 1000 - 100 - 10 - 1


@pytest.mark.anyio
async def test_a_request_that_never_ran_gives_back_everything_admission_took() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=32)
    t = tier(requests=2, tokens=1000, token_window_s=1000)
    kept = _lease(await limiter.admit("u", "kept", t, 100, 500))
    turned_away = _lease(await limiter.admit("u", "queue-full", t, 300, 500))
    await turned_away.settle(ran=False)
    await turned_away.settle(ran=False)
    probe = (await limiter.admit("u", "probe", t, 0, 0)).decision
    assert probe.allowed  # the second request was given back, so this one fits
    assert probe.remaining_requests == 0
    assert probe.remaining_tokens == 1000 - 100 - 32
    await kept.settle()


@pytest.mark.anyio
async def test_take_never_exceeds_max_output_tokens() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=32)
    lease = _lease(await limiter.admit("u", "r", tier(), 0, 40))
    assert await lease.take(32) == 32
    assert await lease.take(32) == 8


@pytest.mark.anyio
async def test_concurrency_slots_free_on_settle_and_expire_with_the_lease_ttl() -> None:
    clock = ManualClock()
    limiter = MemoryLimiter(clock, lease_ttl_s=120)
    t = tier(concurrent=2)
    first = _lease(await limiter.admit("u", "a", t, 1, 1))
    _lease(await limiter.admit("u", "b", t, 1, 1))  # never settled: its edge instance "died"
    denied = (await limiter.admit("u", "c", t, 1, 1)).decision
    assert not denied.allowed and denied.limit == "concurrency"  # its wait: test_concurrency_wait.py
    await first.settle()
    _lease(await limiter.admit("u", "c", t, 1, 1))
    assert not (await limiter.admit("u", "d", t, 1, 1)).decision.allowed
    clock.advance(120)
    assert (await limiter.admit("u", "d", t, 1, 1)).decision.allowed  # b and c expired


@pytest.mark.anyio
async def test_charge_refreshes_the_slot_so_a_live_stream_keeps_it() -> None:
    clock = ManualClock()
    limiter = MemoryLimiter(clock, batch_tokens=1, lease_ttl_s=120)
    t = tier(concurrent=1)
    lease = _lease(await limiter.admit("u", "a", t, 1, 100))
    clock.advance(100)
    assert await lease.take(2) == 2  # extends the lease: the slot now lives until 100 + 120
    clock.advance(100)
    assert not (await limiter.admit("u", "b", t, 1, 1)).decision.allowed


@pytest.mark.anyio
async def test_users_are_limited_independently() -> None:
    limiter = MemoryLimiter(ManualClock())
    t = tier(requests=1)
    assert (await limiter.admit("u1", "a", t, 1, 1)).decision.allowed
    assert (await limiter.admit("u2", "a", t, 1, 1)).decision.allowed
    assert not (await limiter.admit("u1", "b", t, 1, 1)).decision.allowed


@pytest.mark.anyio
async def test_a_budget_smaller_than_one_batch_still_admits_what_fits() -> None:
    limiter = MemoryLimiter(ManualClock(), batch_tokens=32)
    lease = _lease(await limiter.admit("u", "r", tier(tokens=50, token_window_s=1000), 40, 100))
    assert lease.granted == 10
    assert await lease.take(20) == 10


def test_dropping_idle_users_never_stalls_one_call_for_all_the_users_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twin drops idle users now and then (key expiry's stand-in). It looked at every user it
    held in one step every 10,000 calls: on the Redis store's mirror, which holds each user with a
    TAT ahead (a free user's one request: 18 minutes on a daily token budget; all day once it is
    spent), 200,000 users made that one call take 0.67 s, every streaming reply on the edge's loop
    paused with it, every few seconds at a few hundred requests a second. Each call now looks at a
    bounded slice of them (counted here as the budgets it asks whether idle: a timing is the
    machine's)."""
    clock = ManualClock()
    twin = MemoryLimiter(clock)
    free = tier(requests=20, request_window_s=10800, tokens=40000, token_window_s=86400, name="free")
    for i in range(150_000):  # what Redis admitted on this instance: held, a TAT ahead each
        twin.record_admitted(f"user-{i}", f"r{i}", free, 500)
        twin.settle_now(f"user-{i}", free, f"r{i}", 0)
    looked_at = 0
    is_idle = policy.UserState.is_idle

    def counted(state: policy.UserState, now_us: int) -> bool:
        nonlocal looked_at
        looked_at += 1
        return is_idle(state, now_us)

    monkeypatch.setattr(policy.UserState, "is_idle", counted)
    most = 0
    for i in range(20_000):  # any calls past the next sweep
        looked_at = 0
        twin.record_admitted(f"new-{i}", f"n{i}", free, 10)
        most = max(most, looked_at)
    assert 0 < most <= 2_000, most
    # Idle users still go: a day on, every budget is whole again and nothing runs.
    clock.advance(2 * 86400)
    for i in range(200_000):
        twin.settle_now(f"late-{i % 10}", free, "none", 0)
    assert len(twin._users) <= 30_000


def test_the_budgets_a_restore_puts_back_are_listed_slice_by_slice_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MemoryLimiter.active_budgets lists what a restore puts back a slice of users at a time (the
    loop runs between slices): every budget still ahead once, a budget with a ledger too (the
    fallback admitted in it) once, not again from the ledger pass, and none gone idle."""
    monkeypatch.setattr("limiter.memory.LOOK_SLICE", 2)
    clock = ManualClock()
    twin = MemoryLimiter(clock)
    t = tier(requests=10, request_window_s=3600, name="free")
    twin.record_admitted("refilled", "r", t, 1)
    twin.settle_now("refilled", t, "r", 0)
    clock.advance(3600)
    for user in ("a", "b", "c"):
        twin.record_admitted(user, "r", t, 1)  # decided on Redis
    assert twin.decide("b", "f", t, 1, 0, own=True)[0].allowed  # by the fallback alone: a ledger
    assert twin.decide("d", "f", t, 1, 0, own=True)[0].allowed
    slices = list(twin.active_budgets())
    # Five users in slices of two, then the two ledgers in one: both budgets listed already.
    assert len(slices) == 3 + 1 and slices[-1] == []
    assert sorted(key for found in slices for key in found) == [(u, "free") for u in "abcd"]
    assert sorted(key for found in twin.active_budgets(ledgers_only=True) for key in found) == [
        ("b", "free"),
        ("d", "free"),
    ]


def test_a_settle_kept_while_its_restore_waited_is_refunded_in_the_units_of_its_refund() -> None:
    """A request the fallback admitted is settled as never run while a restore carrying its ledger
    waits for a connection; the fleet shrinks from two edges to one meanwhile (the ledger rescaled
    to the whole tier's intervals), and the restore is then called off unsent: the ledger refunds
    the request (ledger_unsent). It was refunded at the rates of the settle's moment, two edges'
    intervals, twice what a request counts by then: the ledger counted one of the two requests
    still held, and the restore told Redis one where two ran (over-admission)."""
    clock = ManualClock()
    twin = MemoryLimiter(clock, instance_count=2)
    t = tier(requests=10, request_window_s=60.0)  # 12 s a request at two edges, 6 s at one
    for request_id in ("r1", "r2", "r3"):
        assert twin.decide("u", request_id, t, 1, 0, own=True)[0].allowed
    built = twin.ledger("u", t.name)
    assert built is not None and built.request_ids == ("r1", "r2", "r3")
    twin.settle_now("u", t, "r1", 0, refund_request=True)  # while its restore waits
    twin.set_instance_count(1)
    twin.ledger_unsent("u", t.name, built)
    left = twin.ledger("u", t.name)
    assert left is not None and left.request_ids == ("r2", "r3")
    now_us = round(clock.now * policy.MICROS)
    assert left.request_tat_us - now_us == 2 * 6 * policy.MICROS  # two requests at one edge's rate
