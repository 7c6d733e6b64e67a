"""The router over replicas: room, load, health, failures."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from edge.admission import Dispatcher, NeverFits, Overloaded, Slot
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket, until
from tests.admission.pipeline import generate_with_failover
from tests.admission.replicas import ControlledUpstream


@pytest.mark.anyio
async def test_never_more_than_a_replica_holds(make_dispatcher: MakeDispatcher) -> None:
    small = ControlledUpstream("small", kv_tokens_total=1000, max_sequences=4)
    large = ControlledUpstream("large", kv_tokens_total=3000, max_sequences=8)
    async with make_dispatcher([small, large], kv_block_tokens=16) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(60):
            flow.submit(ticket(f"u{i % 7}", paid=i % 3 == 0, kv_tokens=90 + 37 * (i % 9)))
        await flow.settle()
        for _ in range(40):
            for replica in (small, large):
                held = [s for s in flow.held() if s.upstream is replica]
                assert sum(s.kv_charge for s in held) <= replica.kv_tokens_total
                assert len(held) <= replica.max_sequences
                assert all(s.kv_charge % 16 == 0 and s.kv_charge >= s.ticket.kv_tokens for s in held)
            await flow.release_oldest()
        await flow.aclose()


@pytest.mark.anyio
async def test_each_replica_charges_in_its_own_kv_blocks(make_dispatcher: MakeDispatcher) -> None:
    coarse = ControlledUpstream("coarse", kv_tokens_total=640, kv_block_tokens=64)
    fine = ControlledUpstream("fine", kv_tokens_total=640, kv_block_tokens=16)
    unknown = ControlledUpstream("unknown", kv_tokens_total=640)  # reports no block size
    async with make_dispatcher([coarse, fine, unknown], kv_block_tokens=8) as dispatcher:
        slots = [await dispatcher.acquire(ticket(f"u{i}", kv_tokens=70)) for i in range(3)]
        charges = {s.upstream.name: s.kv_charge for s in slots}
        for s in slots:
            s.release()
    assert charges == {"coarse": 128, "fine": 80, "unknown": 72}


@pytest.mark.anyio
async def test_room_is_counted_in_the_replicas_whole_blocks(make_dispatcher: MakeDispatcher) -> None:
    # 100 + 60 + 10 tokens would fit 192; in blocks of 64 they take 128 + 64 + 64.
    coarse = ControlledUpstream("coarse", kv_tokens_total=192, kv_block_tokens=64)
    async with make_dispatcher([coarse]) as dispatcher:
        held = [await dispatcher.acquire(ticket(f"u{i}", kv_tokens=n)) for i, n in enumerate((100, 60))]
        assert [s.kv_charge for s in held] == [128, 64]
        with pytest.raises(Overloaded):
            dispatcher.precheck(ticket("u3", kv_tokens=10, max_wait_s=0.0))
        for s in held:
            s.release()


@pytest.mark.anyio
async def test_routes_to_the_least_loaded_replica(make_dispatcher: MakeDispatcher) -> None:
    a, b = ControlledUpstream("a"), ControlledUpstream("b")
    async with make_dispatcher([a, b]) as dispatcher:
        slots = [await dispatcher.acquire(ticket(f"u{i}", kv_tokens=500)) for i in range(6)]
        assert sorted(s.upstream.name for s in slots) == ["a", "a", "a", "b", "b", "b"]
        for s in slots:
            s.release()


@pytest.mark.anyio
async def test_a_failure_before_the_first_token_completes_on_another_replica(
    make_dispatcher: MakeDispatcher,
) -> None:
    broken, healthy = ControlledUpstream("broken"), ControlledUpstream("healthy")
    broken.fail_generation = True
    async with make_dispatcher([broken, healthy]) as dispatcher:
        slot, tokens = await generate_with_failover(dispatcher, ticket("u1"), [1, 2, 3], 2)
        assert (slot.upstream.name, tokens) == ("healthy", [1, 2])

        # With nowhere left to go, the retry is refused instead of waiting forever.
        healthy.fail_generation = True
        with pytest.raises(Overloaded) as refused:
            await generate_with_failover(dispatcher, ticket("u2"), [1, 2, 3], 2)
        assert refused.value.reason == "no_replica"


@pytest.mark.anyio
async def test_a_failed_replica_gets_work_again_only_after_its_health_check(
    make_dispatcher: MakeDispatcher,
) -> None:
    a, b = ControlledUpstream("a"), ControlledUpstream("b")
    async with make_dispatcher([a, b], poll_interval_s=3600) as dispatcher:
        first: Slot = await dispatcher.acquire(ticket("u1"))
        first.release(failed=True)
        # The suspect replica is the least loaded, but everything goes elsewhere.
        others = [await dispatcher.acquire(ticket(f"u{i}")) for i in range(3)]
        assert {s.upstream.name for s in others} == {"a", "b"} - {first.upstream.name}
        for s in others:
            s.release()

        await dispatcher.check_replicas()  # the periodic check, now rather than in an hour
        back = [await dispatcher.acquire(ticket(f"v{i}")) for i in range(2)]
        assert {s.upstream.name for s in back} == {"a", "b"}


@pytest.mark.anyio
async def test_health_failed_replica_is_skipped_until_it_recovers(make_dispatcher: MakeDispatcher) -> None:
    a, b = ControlledUpstream("a"), ControlledUpstream("b")
    a.is_ready = False
    async with make_dispatcher([a, b]) as dispatcher:
        slots = [await dispatcher.acquire(ticket(f"u{i}")) for i in range(4)]
        assert {s.upstream.name for s in slots} == {"b"}

        a.is_ready = True
        seen = a.ready_calls
        await until(lambda: a.ready_calls >= seen + 2)  # one whole poll after the change
        slot = await dispatcher.acquire(ticket("after"))
        assert slot.upstream.name == "a"


@pytest.mark.anyio
async def test_no_healthy_replica_is_overloaded_for_waiters_and_newcomers(
    make_dispatcher: MakeDispatcher,
) -> None:
    only = ControlledUpstream("only", max_sequences=1)
    async with make_dispatcher([only]) as dispatcher:
        flow = Flow(dispatcher)
        flow.submit(ticket("holder"))
        waiter = flow.submit(ticket("waiter"))
        await flow.settle()

        only.is_ready = False
        await flow.settle()
        await until(waiter.done)
        assert isinstance(waiter.exception(), Overloaded)
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(ticket("newcomer"))
        assert refused.value.reason == "no_replica"
        await flow.aclose()


@pytest.mark.anyio
async def test_a_replica_being_restarted_is_waited_for_not_refused(make_dispatcher: MakeDispatcher) -> None:
    """The local engine process restarts its child: with one replica, every request meeting the
    crash got a 503 no_replica (or a 502), and the SDK's retries ran out before it served again."""
    only = ControlledUpstream("only")
    async with make_dispatcher([only], poll_interval_s=3600) as dispatcher:
        only.is_ready, only.restart_eta_s = False, 2.0
        await dispatcher.check_replicas()
        newcomer = ticket("newcomer", max_wait_s=60.0)
        dispatcher.precheck(newcomer)  # not refused
        flow = Flow(dispatcher)
        waiter = flow.submit(newcomer)
        await flow.settle()
        assert not waiter.done()

        # Another check still finds it restarting: the waiter keeps waiting.
        only.restart_eta_s = 0.5
        await dispatcher.check_replicas()
        await flow.settle()
        assert not waiter.done()

        only.is_ready, only.restart_eta_s = True, None
        await dispatcher.check_replicas()
        await until(waiter.done)
        assert waiter.result().upstream is only
        await flow.aclose()


@pytest.mark.anyio
async def test_a_restart_longer_than_the_wait_is_refused_until_it_should_be_over(
    make_dispatcher: MakeDispatcher,
) -> None:
    only = ControlledUpstream("only")
    async with make_dispatcher([only], poll_interval_s=3600) as dispatcher:
        only.is_ready, only.restart_eta_s = False, 45.0
        await dispatcher.check_replicas()
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(ticket("short", max_wait_s=30.0))
        assert (refused.value.reason, refused.value.retry_after_s) == ("no_replica", 45.0)
        dispatcher.precheck(ticket("patient", max_wait_s=60.0))


@pytest.mark.anyio
async def test_waiters_for_a_restart_that_failed_are_turned_away(make_dispatcher: MakeDispatcher) -> None:
    only = ControlledUpstream("only")
    async with make_dispatcher([only], poll_interval_s=3600) as dispatcher:
        only.is_ready, only.restart_eta_s = False, 2.0
        await dispatcher.check_replicas()
        flow = Flow(dispatcher)
        waiter = flow.submit(ticket("waiter"))
        await flow.settle()
        assert not waiter.done()

        # The new child failed to load: down, and nobody says when it is back.
        only.restart_eta_s = None
        await dispatcher.check_replicas()
        await until(waiter.done)
        refused = waiter.exception()
        assert isinstance(refused, Overloaded) and refused.reason == "no_replica"
        with pytest.raises(Overloaded):
            dispatcher.precheck(ticket("newcomer"))
        await flow.aclose()


@pytest.mark.anyio
async def test_a_replica_being_restarted_does_not_hold_back_another_with_room(
    make_dispatcher: MakeDispatcher,
) -> None:
    restarting, other = ControlledUpstream("restarting"), ControlledUpstream("other")
    async with make_dispatcher([restarting, other], poll_interval_s=3600) as dispatcher:
        restarting.is_ready, restarting.restart_eta_s = False, 2.0
        await dispatcher.check_replicas()
        slot = await dispatcher.acquire(ticket("u1"))
        assert slot.upstream is other
        slot.release()


@pytest.mark.anyio
async def test_the_wait_for_a_restarting_replica_is_its_restart_then_its_batches(
    make_dispatcher: MakeDispatcher,
) -> None:
    """Requests arriving while the only engine restarted were counted as if at one replica of the
    prior that serves one request at a time: 28 of 40 paid requests were refused 429 wait_too_long
    (Retry-After 65 s) while it served again 4 s later with room for 64. Now the wait is until it
    is back, then the line at its rate, full."""
    only = ControlledUpstream("only", max_sequences=10)
    async with make_dispatcher([only], poll_interval_s=3600, prior_service_s=2.0) as dispatcher:
        only.is_ready, only.restart_eta_s = False, 2.0
        await dispatcher.check_replicas()
        flow = Flow(dispatcher)
        for i in range(12):
            flow.submit(ticket(f"u{i}", max_wait_s=60.0))
        await flow.settle()
        assert dispatcher.queue_depth() == 12
        # 13th in line: back in 2 s, then 10 at a time, each for 2 s: about 4.6 s (one at a time
        # at the prior, 26 s: refused).
        dispatcher.precheck(ticket("newcomer", max_wait_s=10.0))
        assert 2.0 < dispatcher.estimate_wait_s(ticket("newcomer")) < 5.0

        only.restart_eta_s = 9.0  # the restart itself is part of the wait
        await dispatcher.check_replicas()
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(ticket("newcomer", max_wait_s=10.0))
        assert refused.value.reason == "wait_too_long"
        assert 11.0 < refused.value.retry_after_s < 12.0
        await flow.aclose()


class _ComesUpDuringItsCheck(ControlledUpstream):
    """Restarting until a health check asks: it answers not ready, and its new child serves the
    moment after, before the replica set reads back_in_s (which says None: no restart under way)."""

    comes_up = False

    async def ready(self) -> bool:
        was_ready = await super().ready()
        if self.comes_up:
            self.comes_up = False
            self.is_ready, self.restart_eta_s = True, None
        return was_ready


@pytest.mark.anyio
async def test_waiters_of_a_replica_that_comes_up_during_its_check_keep_waiting(
    make_dispatcher: MakeDispatcher,
) -> None:
    """Read after ready() alone, back_in_s of a replica that came up in between read as a restart
    that failed: its waiters were turned away no_replica at once."""
    only = _ComesUpDuringItsCheck("only")
    async with make_dispatcher([only], poll_interval_s=3600) as dispatcher:
        only.is_ready, only.restart_eta_s = False, 2.0
        await dispatcher.check_replicas()
        flow = Flow(dispatcher)
        waiter = flow.submit(ticket("waiter"))
        await flow.settle()

        only.comes_up = True
        await dispatcher.check_replicas()
        await flow.settle()
        assert not waiter.done()  # before: failed no_replica

        await dispatcher.check_replicas()
        await until(waiter.done)
        assert waiter.result().upstream is only
        await flow.aclose()


@pytest.mark.anyio
async def test_queue_depth_per_replica_counts_healthy_replicas(make_dispatcher: MakeDispatcher) -> None:
    a, b = ControlledUpstream("a", max_sequences=1), ControlledUpstream("b", max_sequences=1)
    async with make_dispatcher([a, b]) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(8):
            flow.submit(ticket(f"u{i}"))
        await flow.settle()
        assert dispatcher.queue_depth() == 6
        assert dispatcher.queue_depth_per_replica() == 3.0
        await flow.aclose()


@pytest.mark.anyio
async def test_two_edge_instances_sharing_a_replica_fill_only_their_share(
    make_dispatcher: MakeDispatcher,
) -> None:
    shared = ControlledUpstream("shared", kv_tokens_total=1000, max_sequences=10)
    async with (
        make_dispatcher([shared], replica_share=0.5) as first,
        make_dispatcher([shared], replica_share=0.5) as second,
    ):
        flows = [Flow(first), Flow(second)]
        for flow in flows:
            for i in range(8):
                flow.submit(ticket(f"u{i}", kv_tokens=100))
            await flow.settle()
        held = [len(flow.held()) for flow in flows]
        assert held == [5, 5]
        for flow in flows:
            await flow.aclose()


@pytest.mark.anyio
async def test_each_replica_is_filled_to_its_own_share_one_discovered_later_included(
    make_dispatcher: MakeDispatcher,
) -> None:
    """[fleet] members_per_replica: this edge is among one replica's few members (its whole, here)
    and not among another's (none of it): tickets land on the first only. A replica discovered
    afterwards joins at the share the fleet gives it, not at the share the edge started with."""
    mine = ControlledUpstream("mine", kv_tokens_total=1000, max_sequences=10)
    theirs = ControlledUpstream("theirs", kv_tokens_total=1000, max_sequences=10)
    shares = {"mine": 1.0, "theirs": 0.0, "later": 0.5}
    async with make_dispatcher([mine, theirs], replica_share=0.5) as dispatcher:
        dispatcher.set_replica_shares(shares.__getitem__)
        await dispatcher.add_upstream(ControlledUpstream("later", kv_tokens_total=1000, max_sequences=10))
        flow = Flow(dispatcher)
        for i in range(20):
            flow.submit(ticket(f"u{i}", kv_tokens=100))
        await flow.settle()
        held = sorted(slot.upstream.name for slot in flow.held())
        assert held == ["later"] * 5 + ["mine"] * 10
        await flow.aclose()


@pytest.mark.anyio
async def test_the_free_share_of_a_replica_among_many_edges_is_rounded_once(
    make_dispatcher: MakeDispatcher,
) -> None:
    """40 edges (Terraform's edge_max_count) in front of Triton's 64 sequences: each edge's part,
    1.6 sequences, was rounded down to 1 before the reserve was taken off it (0.8, rounded down
    again): free tiers got 0 sequences on every edge, and every free request 503 no_replica while
    the replicas idled, from 33 edges on. Rounded once, free gets 1 of each edge's 1.28, paid 1 of
    its 1.6, and the 40 edges' free work (40) still stays within 80 % of the replica (51.2)."""
    shared = ControlledUpstream("shared", kv_tokens_total=400_000, max_sequences=64)
    async with make_dispatcher([shared], replica_share=1 / 40, reserved_paid_fraction=0.2) as dispatcher:
        free = ticket("f")
        dispatcher.precheck(free)
        slot = await dispatcher.acquire(free)
        # The reserve still holds: this edge's second free request waits for the first.
        flow = Flow(dispatcher)
        waiting = flow.submit(ticket("f2"))
        await flow.settle()
        assert not waiting.done() and dispatcher.queue_depth() == 1
        slot.release()
        await flow.settle()
        assert waiting.done()
        await flow.aclose()


class _HangingCheck(ControlledUpstream):
    """A replica whose health check, once `hang` is set, never answers (its timeout is the bound)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.hang = False
        self.hung = asyncio.Event()

    async def ready(self) -> bool:
        if self.hang:
            self.hung.set()
            await asyncio.Event().wait()
        return await super().ready()


@pytest.mark.anyio
async def test_a_replica_whose_check_passed_takes_its_waiters_while_another_check_still_hangs(
    make_dispatcher: MakeDispatcher,
) -> None:
    """A poll checks every replica at once; the queue was reconsidered only once the slowest
    check ended, so a replica cleared by its own check sat idle beside its waiters for as long as
    a hung replica's check took (health_timeout_s; a helper's review)."""
    good = ControlledUpstream("good", max_sequences=1)
    hung = _HangingCheck("hung")
    hung.kv_tokens_total = 10  # too small for the tickets here: only "good" can take them
    async with make_dispatcher([good, hung], poll_interval_s=1000.0, health_timeout_s=3600.0) as dispatcher:
        flow = Flow(dispatcher)
        first = await dispatcher.acquire(ticket("u0"))
        assert first.upstream is good
        waiting = flow.submit(ticket("u1"))
        await flow.settle()
        first.release(failed=True)  # "good" takes no new work until a check after this passes
        await flow.settle()
        assert not waiting.done()
        hung.hang = True
        check = asyncio.create_task(dispatcher.check_replicas())
        await hung.hung.wait()
        await until(waiting.done)
        assert not check.done()  # placed while the hung replica's check is still waiting
        assert waiting.result().upstream is good
        waiting.result().release()
        check.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await check
        await flow.aclose()


class _AnswersWhenTold(ControlledUpstream):
    """A replica whose health check, once `held` is set, answers only when `go` is set."""

    def __init__(self, name: str, kv_tokens_total: int = 10_000) -> None:
        super().__init__(name, kv_tokens_total=kv_tokens_total)
        self.held = False
        self.asked = asyncio.Event()
        self.go = asyncio.Event()

    async def ready(self) -> bool:
        if self.held:
            self.asked.set()
            await self.go.wait()
        return await super().ready()


def _capacity_of(dispatcher: Dispatcher, i: int) -> int | None:
    capacity = dispatcher.replica_states()[i].capacity
    return None if capacity is None else capacity.kv_tokens_total


@pytest.mark.anyio
async def test_a_waiter_is_judged_on_every_answer_of_a_poll_not_on_some_beside_others_stale(
    make_dispatcher: MakeDispatcher,
) -> None:
    """The only replica that can hold the waiter was last seen restarting, back in 45 s, past the
    waiter's 30 s. In the next poll it answers ready, after a small replica whose size changed
    (room lost, so waiters that fit nowhere are failed): judged on the small one's answer beside
    the big one's stale 45 s, the waiter was failed no_replica, though the same poll found its
    replica up (a review of the commit that placed waiters on each answer)."""
    big = _AnswersWhenTold("big")
    small = _AnswersWhenTold("small", kv_tokens_total=10)  # too small for the tickets here
    async with make_dispatcher([big, small], poll_interval_s=3600, health_timeout_s=3600) as dispatcher:
        big.is_ready, big.restart_eta_s = False, 2.0
        await dispatcher.check_replicas()
        flow = Flow(dispatcher)
        waiter = flow.submit(ticket("waiter", max_wait_s=30.0))
        await flow.settle()
        big.restart_eta_s = 45.0
        await dispatcher.check_replicas()
        await flow.settle()
        assert not waiter.done()

        big.is_ready, big.restart_eta_s = True, None
        small.kv_tokens_total = 20
        big.held = small.held = True
        poll = asyncio.create_task(dispatcher.check_replicas())
        await big.asked.wait()
        await small.asked.wait()
        small.go.set()
        await until(lambda: _capacity_of(dispatcher, 1) == 20)
        await flow.settle()
        assert not waiter.done()  # the small one's answer alone fails nobody
        big.go.set()
        await poll
        await until(waiter.done)
        assert waiter.result().upstream is big
        waiter.result().release()
        await flow.aclose()


@pytest.mark.anyio
async def test_a_replica_added_during_a_poll_does_not_fail_a_waiter_the_poll_finds_a_home_for(
    make_dispatcher: MakeDispatcher,
) -> None:
    """An added replica's first check acted on room lost at once, judged on the others' last
    answers, as a poll's checks did before the commit above: replica discovery adding a small
    replica while a poll was finding the waiter's replica up failed the waiter no_replica (a
    review)."""
    big = _AnswersWhenTold("big")
    async with make_dispatcher([big], poll_interval_s=3600, health_timeout_s=3600) as dispatcher:
        big.is_ready, big.restart_eta_s = False, 2.0
        await dispatcher.check_replicas()
        flow = Flow(dispatcher)
        waiter = flow.submit(ticket("waiter", max_wait_s=30.0))
        await flow.settle()
        big.restart_eta_s = 45.0  # last seen: back past the waiter's wait
        await dispatcher.check_replicas()
        await flow.settle()
        assert not waiter.done()

        big.is_ready, big.restart_eta_s = True, None
        big.held = True
        poll = asyncio.create_task(dispatcher.check_replicas())
        await big.asked.wait()
        # Replica discovery adds a small replica (too small for the waiter) while the poll waits.
        await dispatcher.add_upstream(ControlledUpstream("small", kv_tokens_total=10))
        await flow.settle()
        failed = waiter.done() and isinstance(waiter.exception(), Overloaded)
        big.go.set()
        await poll
        await until(waiter.done)
        assert not failed, "failed no_replica while the poll in flight found its replica up"
        assert waiter.result().upstream is big
        waiter.result().release()
        await flow.aclose()


@pytest.mark.anyio
async def test_a_replica_down_from_the_start_is_logged(make_dispatcher: MakeDispatcher) -> None:
    """`--triton HOST:PORT` naming a port nothing answers (a typo, Triton's gRPC port): the replica
    never passed a check, so it never changed state, and nothing in the log said it was down while
    every request got 503 no_replica. Its first check says so, once; an up one's says it is up."""
    from structlog.testing import capture_logs

    down = ControlledUpstream("down")
    down.is_ready = False
    up = ControlledUpstream("up")
    with capture_logs() as logs:
        async with make_dispatcher([down, up]) as dispatcher:
            await dispatcher.replicas.check_all()
    health = [(e["replica"], e["alive"]) for e in logs if e["event"] == "replica_health"]
    assert sorted(health) == [("down", False), ("up", True)]


@pytest.mark.anyio
async def test_only_what_no_replica_could_ever_hold_never_fits(make_dispatcher: MakeDispatcher) -> None:
    """NeverFits (a 400) is judged on the tier's part of each replica's whole size: not on this
    edge's share of a replica the fleet divides (it grows as edges leave: a 503 for now), nor on
    what the replicas hold, nor while any replica's size is unknown."""
    shared = ControlledUpstream("shared", kv_tokens_total=1000, max_sequences=4)
    async with make_dispatcher([shared], replica_share=0.5, reserved_paid_fraction=0.2) as dispatcher:
        past_share = ticket("paid", paid=True, kv_tokens=900)
        dispatcher.check_fits(past_share)
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(past_share)
        assert refused.value.reason == "no_replica"
        with pytest.raises(NeverFits) as never:
            dispatcher.check_fits(ticket("free", kv_tokens=900))
        assert (never.value.kv_tokens, never.value.kv_limit, never.value.sequences) == (900, 800, True)
        with pytest.raises(NeverFits):
            dispatcher.check_fits(ticket("paid", paid=True, kv_tokens=1001))

        # Down, its size as last seen still says what it could hold once back.
        shared.is_ready = False
        await dispatcher.check_replicas()
        dispatcher.check_fits(ticket("free", kv_tokens=800))
        with pytest.raises(NeverFits):
            dispatcher.check_fits(ticket("free", kv_tokens=801))

    unknown = ControlledUpstream("unknown")
    unknown.is_ready = False
    async with make_dispatcher([unknown]) as dispatcher:
        dispatcher.check_fits(ticket("paid", paid=True, kv_tokens=10**9))
    # Nor while any replica's size is unknown: it may be the larger one.
    small = ControlledUpstream("small", kv_tokens_total=64)
    async with make_dispatcher([small, unknown]) as dispatcher:
        dispatcher.check_fits(ticket("paid", paid=True, kv_tokens=10**9))


@pytest.mark.anyio
async def test_past_a_fixed_share_of_every_replica_never_fits(make_dispatcher: MakeDispatcher) -> None:
    """A share nothing changes (the in-memory limiter's static instance_count: share_fixed) never
    grows: past it, a 503 no_replica was obeyed forever. NeverFits is judged on it then, and says so
    (`shared`); a paid ticket within it, past the free tiers' part of it, is still one that fits."""
    shared = ControlledUpstream("shared", kv_tokens_total=1000, max_sequences=4)
    async with make_dispatcher(
        [shared], replica_share=0.5, share_fixed=True, reserved_paid_fraction=0.2
    ) as dispatcher:
        dispatcher.check_fits(ticket("paid", paid=True, kv_tokens=500))
        with pytest.raises(NeverFits) as never:
            dispatcher.check_fits(ticket("paid", paid=True, kv_tokens=501))
        assert (never.value.kv_limit, never.value.shared) == (500, True)
        with pytest.raises(NeverFits) as never:
            dispatcher.check_fits(ticket("free", kv_tokens=401))
        assert (never.value.kv_limit, never.value.shared) == (400, True)
        with pytest.raises(RuntimeError):
            dispatcher.set_replica_shares(lambda _name: 1.0)
