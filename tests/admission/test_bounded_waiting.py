"""Overload answers: a full queue, a wait estimated too long, a wait that ran too long, a cancelled wait."""

from __future__ import annotations

import asyncio

import pytest

from edge.admission import Dispatcher, Overloaded
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket, until
from tests.admission.replicas import ControlledUpstream


@pytest.mark.anyio
async def test_queue_full_is_overloaded_with_a_retry_after(make_dispatcher: MakeDispatcher) -> None:
    # Learnt from short replies (1 ms each), the completion rate says a place frees every 1 ms;
    # the Retry-After is a quarter of a second all the same, not a burst of retries 1 ms apart.
    upstream = ControlledUpstream("r1", max_sequences=1)
    async with make_dispatcher([upstream], max_queue=3, prior_service_s=0.001) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(4):
            flow.submit(ticket(f"u{i}"))
        await flow.settle()
        assert dispatcher.queue_depth() == 3

        with pytest.raises(Overloaded) as precheck:
            dispatcher.precheck(ticket("late"))
        assert precheck.value.reason == "queue_full"
        assert precheck.value.retry_after_s == 0.25
        with pytest.raises(Overloaded) as acquire:
            await dispatcher.acquire(ticket("late"))
        assert acquire.value.reason == "queue_full"
        await flow.aclose()


@pytest.mark.anyio
async def test_wait_estimate_grows_with_the_queue_ahead(make_dispatcher: MakeDispatcher) -> None:
    # Prior: 10 s per request, one request at a time: ten waiting means about a hundred seconds.
    replica = ControlledUpstream("r1", max_sequences=1)
    async with make_dispatcher([replica], prior_service_s=10.0) as dispatcher:
        dispatcher.precheck(ticket("idle", max_wait_s=0.0))  # room now: no wait at all

        flow = Flow(dispatcher)
        for i in range(6):
            flow.submit(ticket(f"u{i}"))
        await flow.settle()
        with pytest.raises(Overloaded) as short:
            dispatcher.precheck(ticket("new", max_wait_s=30.0))
        for i in range(6, 11):
            flow.submit(ticket(f"u{i}"))
        await flow.settle()
        with pytest.raises(Overloaded) as long:
            dispatcher.precheck(ticket("new", max_wait_s=30.0))

        assert short.value.reason == long.value.reason == "wait_too_long"
        assert 30.0 < short.value.retry_after_s < long.value.retry_after_s
        dispatcher.precheck(ticket("new", max_wait_s=200.0))  # a patient tier still gets in
        await flow.aclose()


@pytest.mark.anyio
async def test_a_light_user_behind_a_flood_is_not_turned_away(make_dispatcher: MakeDispatcher) -> None:
    async with make_dispatcher(
        [ControlledUpstream("r1", max_sequences=1)], prior_service_s=1.0
    ) as dispatcher:
        flow = Flow(dispatcher)
        for _ in range(50):
            flow.submit(ticket("flooder"))
        await flow.settle()
        # DRR serves the newcomer after one more flooder request, not after all fifty.
        dispatcher.precheck(ticket("newcomer", max_wait_s=10.0))
        with pytest.raises(Overloaded):
            dispatcher.precheck(ticket("flooder", max_wait_s=10.0))
        await flow.aclose()


@pytest.mark.anyio
async def test_acquire_gives_up_after_max_wait(make_dispatcher: MakeDispatcher) -> None:
    async with make_dispatcher([ControlledUpstream("r1", max_sequences=1)]) as dispatcher:
        holder = await dispatcher.acquire(ticket("holder"))
        with pytest.raises(Overloaded) as waited:
            await dispatcher.acquire(ticket("impatient", max_wait_s=0.05))
        assert waited.value.reason == "wait_too_long"
        assert waited.value.retry_after_s > 0
        assert dispatcher.queue_depth() == 0
        holder.release()


@pytest.mark.anyio
async def test_cancelling_a_waiting_acquire_leaves_the_queue(make_dispatcher: MakeDispatcher) -> None:
    async with make_dispatcher([ControlledUpstream("r1", max_sequences=1)]) as dispatcher:
        flow = Flow(dispatcher)
        holder = flow.submit(ticket("holder"))
        gone = flow.submit(ticket("gone"))
        stays = flow.submit(ticket("stays"))
        await flow.settle()
        assert dispatcher.queue_depth() == 2

        gone.cancel()
        await until(gone.done)
        assert dispatcher.queue_depth() == 1
        holder.result().release()
        await flow.settle()
        assert stays.done() and stays.result().ticket.user == "stays"
        await flow.aclose()


@pytest.mark.anyio
async def test_a_slot_granted_to_a_cancelled_waiter_is_given_back(make_dispatcher: MakeDispatcher) -> None:
    async with make_dispatcher([ControlledUpstream("r1", max_sequences=1)]) as dispatcher:
        holder = await dispatcher.acquire(ticket("holder"))
        waiting = asyncio.create_task(dispatcher.acquire(ticket("waiting")))
        flow = Flow(dispatcher)
        flow.tasks.append(waiting)
        await flow.settle()
        # Grant and cancel in the same loop turn: the task wakes up cancelled holding a slot.
        holder.release()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        again = await asyncio.wait_for(dispatcher.acquire(ticket("next")), 5)
        assert again.upstream.name == "r1"
        again.release()


@pytest.mark.anyio
async def test_a_free_flood_that_fills_the_queue_does_not_turn_paid_away(
    make_dispatcher: MakeDispatcher,
) -> None:
    """max_queue counts the tickets a newcomer would wait behind: a paid request passes every free
    one, so a queue full of free requests is no reason to refuse it; a full paid queue is."""
    replica = ControlledUpstream("r1", kv_tokens_total=1000, max_sequences=10)
    async with make_dispatcher([replica], reserved_paid_fraction=0.2, max_queue=20) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(8 + 20):  # 8 fill the unreserved share, 20 wait: full for free requests
            flow.submit(ticket(f"free-{i}"))
        await flow.settle()
        assert len(flow.held()) == 8 and dispatcher.queue_depth() == 20
        with pytest.raises(Overloaded) as free:
            dispatcher.precheck(ticket("free-late"))
        assert free.value.reason == "queue_full"

        paid = ticket("paid-user", paid=True)
        dispatcher.precheck(paid)
        slot = await dispatcher.acquire(paid)  # the reserve is empty: placed at once
        slot.release()
        await flow.aclose()


@pytest.mark.anyio
async def test_one_users_flood_that_fills_the_queue_does_not_turn_the_tiers_other_users_away(
    make_dispatcher: MakeDispatcher,
) -> None:
    """A full queue still takes a user who holds less than an equal share of its tier's places;
    the user who filled it, and a newcomer at its share, are turned away."""
    replica = ControlledUpstream("r1", max_sequences=1)
    async with make_dispatcher([replica], max_queue=4) as dispatcher:
        flow = Flow(dispatcher)
        for _ in range(5):  # one placed, four waiting: the queue is full
            flow.submit(ticket("heavy"))
        await flow.settle()
        assert dispatcher.queue_depth() == 4
        with pytest.raises(Overloaded) as heavy:
            dispatcher.precheck(ticket("heavy"))
        assert heavy.value.reason == "queue_full"

        # Two users waiting: a share of two places each.
        for _ in range(2):
            dispatcher.precheck(ticket("light"))
            flow.submit(ticket("light"))
            await flow.settle()
        assert dispatcher.queue_depth() == 6
        with pytest.raises(Overloaded) as light:
            dispatcher.precheck(ticket("light"))
        assert light.value.reason == "queue_full"
        await flow.aclose()


@pytest.mark.anyio
async def test_newcomers_below_their_share_never_take_the_queue_past_twice_max_queue(
    make_dispatcher: MakeDispatcher,
) -> None:
    # Each newcomer's share (max_queue over the users waiting) added up to several times max_queue:
    # 20 waiting at max_queue 8, 482 at 100 (a review).
    replica = ControlledUpstream("r1", max_sequences=1)
    async with make_dispatcher([replica], max_queue=8) as dispatcher:
        flow = Flow(dispatcher)
        for _ in range(9):
            flow.submit(ticket("heavy"))
        await flow.settle()
        for i in range(20):
            while True:
                try:
                    dispatcher.precheck(ticket(f"newcomer-{i}"))
                except Overloaded:
                    break
                flow.submit(ticket(f"newcomer-{i}"))
                await flow.settle()
        assert dispatcher.queue_depth() == 16
        await flow.aclose()


async def _quick_replies(dispatcher: Dispatcher, now: list[float]) -> None:
    """Ten 8-token replies of 0.1 s each, run to their end: a fast completion rate learnt."""
    for _ in range(10):
        slot = await dispatcher.acquire(ticket("quick", kv_tokens=20 + 8, prompt_tokens=20))
        now[0] += 0.1
        slot.grow(8)
        slot.mark_finished()
        slot.release()


@pytest.mark.anyio
async def test_a_full_queues_retry_after_waits_for_a_long_reply_holding_the_place(
    make_dispatcher: MakeDispatcher,
) -> None:
    """Short replies taught a fast completion rate; then a long one holds the only place. Its pace
    and its user's typical length say when it frees: 0.25 s before (a review: 0.9 s, obeyed and
    refused 18 times while the place stayed busy for 18 s)."""
    now = [0.0]
    replica = ControlledUpstream("r1", max_sequences=1)
    async with make_dispatcher([replica], max_queue=4, clock=lambda: now[0]) as dispatcher:
        await _quick_replies(dispatcher, now)
        long = await dispatcher.acquire(ticket("writer", kv_tokens=20 + 500, prompt_tokens=20))
        long.grow(1)  # its first token, at once
        flow = Flow(dispatcher)
        for i in range(4):
            flow.submit(ticket(f"waiting-{i}", kv_tokens=28, prompt_tokens=20))
        await flow.settle()
        now[0] += 2.0
        long.grow(56)  # 27.5 tokens a second; its user's replies unknown: 256 tokens expected
        with pytest.raises(Overloaded) as early:
            dispatcher.precheck(ticket("late", kv_tokens=28, prompt_tokens=20))
        now[0] += 7.0
        long.grow(252)  # nearly the 256 expected
        with pytest.raises(Overloaded) as near_the_end:
            dispatcher.precheck(ticket("late", kv_tokens=28, prompt_tokens=20))
        long.release()
        await flow.aclose()
    assert early.value.reason == "queue_full"
    # The place frees then; the four ahead take it in turn, a learnt 0.1 s each.
    assert early.value.retry_after_s == pytest.approx(200 * 2.0 / 55 + 4 * 0.1)
    assert near_the_end.value.retry_after_s < 1.0


@pytest.mark.anyio
async def test_a_wait_too_long_retry_after_waits_for_a_long_reply_holding_the_place(
    make_dispatcher: MakeDispatcher,
) -> None:
    """As the full queue's above, for a ticket refused up front because its estimated wait passes
    its tier's max_wait_s: its Retry-After was the estimate alone (1.3 s: twelve ahead at a learnt
    0.1 s each) while the only place stayed busy for 7 s more; a client obeying it was refused again."""
    now = [0.0]
    replica = ControlledUpstream("r1", max_sequences=1)
    async with make_dispatcher([replica], max_queue=16, clock=lambda: now[0]) as dispatcher:
        await _quick_replies(dispatcher, now)
        long = await dispatcher.acquire(ticket("writer", kv_tokens=20 + 500, prompt_tokens=20))
        long.grow(1)
        flow = Flow(dispatcher)
        for i in range(12):
            flow.submit(ticket(f"waiting-{i}", kv_tokens=28, prompt_tokens=20))
        await flow.settle()
        now[0] += 2.0
        long.grow(56)  # 27.5 tokens a second, 256 expected: the place frees in 7.3 s
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(ticket("late", kv_tokens=28, prompt_tokens=20, max_wait_s=1.0))
        long.release()
        await flow.aclose()
    assert refused.value.reason == "wait_too_long"
    # The place frees then; the twelve ahead take it in turn, a learnt 0.1 s each.
    assert refused.value.retry_after_s == pytest.approx(200 * 2.0 / 55 + 12 * 0.1)


@pytest.mark.anyio
async def test_a_stalled_stream_or_one_far_down_the_line_does_not_make_retry_after_absurd(
    make_dispatcher: MakeDispatcher,
) -> None:
    """A stream stalled after two tokens read as one that ends in hours (635 s after a 5 s stall,
    3,810 s after 30 s); behind more tickets than places, the slowest running request set everyone's
    Retry-After (3,780 s), though the first places to free go to those ahead (a review)."""
    now = [0.0]
    replica = ControlledUpstream("r1", max_sequences=2)
    async with make_dispatcher([replica], max_queue=4, clock=lambda: now[0]) as dispatcher:
        stalled = await dispatcher.acquire(ticket("stalled", kv_tokens=20 + 500, prompt_tokens=20))
        quick = await dispatcher.acquire(ticket("quick", kv_tokens=20 + 500, prompt_tokens=20))
        stalled.grow(1)
        quick.grow(1)
        now[0] += 0.1
        stalled.grow(2)
        quick.grow(250)
        flow = Flow(dispatcher)
        for i in range(4):
            flow.submit(ticket(f"waiting-{i}", kv_tokens=28, prompt_tokens=20))
        await flow.settle()
        now[0] += 30.0  # the stalled one has made nothing since
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(ticket("late", kv_tokens=28, prompt_tokens=20))
        stalled.release()
        quick.release()
        await flow.aclose()
    assert refused.value.reason == "queue_full"
    assert refused.value.retry_after_s <= 60.0


@pytest.mark.anyio
async def test_further_back_in_line_than_places_run_is_told_when_its_place_frees(
    make_dispatcher: MakeDispatcher,
) -> None:
    """Two places, ending in about 0.02 s and 24 s, two waiting: the third in line was told the
    soonest end (0.25 s, where the one second in line was told 24.5 s; a review). Each place is
    taken again by the next in line, a typical service (the 5 s prior here) later."""
    now = [0.0]
    replica = ControlledUpstream("r1", max_sequences=2)
    async with make_dispatcher([replica], max_queue=2, clock=lambda: now[0]) as dispatcher:
        slots = [await dispatcher.acquire(ticket(u, kv_tokens=20 + 500, prompt_tokens=20)) for u in "ab"]
        for slot in slots:
            slot.grow(1)
        now[0] += 1.0
        slots[0].grow(250)  # about 0.02 s to go of a typical 256
        slots[1].grow(11)  # about 24 s to go
        flow = Flow(dispatcher)
        for user in ("w1", "w2"):
            flow.submit(ticket(user, kv_tokens=28, prompt_tokens=20))
        await flow.settle()
        with pytest.raises(Overloaded) as third:
            dispatcher.precheck(ticket("late", kv_tokens=28, prompt_tokens=20))
        for slot in slots:
            slot.release()
        await flow.aclose()
    # The soonest place frees at 0.02 s, for w1; again 5 s later, for w2; the next 5 s after that.
    assert third.value.retry_after_s == pytest.approx(0.02 + 2 * 5.0, abs=0.05)


@pytest.mark.anyio
async def test_places_whose_replies_tell_nothing_yet_still_free_in_turn(
    make_dispatcher: MakeDispatcher,
) -> None:
    """Eight places, seven held by replies still in their prefill (no pace yet: running_ends.py
    leaves them out) and one near its end, forty users waiting: every place frees about once a
    learnt second, so the forty-first place frees in about 5.5 s, which the wait estimate says too
    (5.1 s). Counted as the one informative place cycling alone, the refusal's Retry-After was
    40.8 s, eight times the wait; since wait_too_long took its Retry-After from the same figure
    (c273ce2), a tier's ordinary overload told its clients to stay away for 40 s."""
    now = [0.0]
    replica = ControlledUpstream("r1", max_sequences=8)
    async with make_dispatcher([replica], prior_service_s=1.0, clock=lambda: now[0]) as dispatcher:
        slots = [
            await dispatcher.acquire(ticket(f"running-{i}", kv_tokens=20 + 500, prompt_tokens=20))
            for i in range(8)
        ]
        slots[0].grow(1)
        now[0] += 0.5
        slots[0].grow(100)  # about 0.79 s to go of a typical 256; the other seven in their prefill
        flow = Flow(dispatcher)
        for i in range(40):
            flow.submit(ticket(f"waiting-{i}", kv_tokens=28, prompt_tokens=20))
        await flow.settle()
        late = ticket("late", kv_tokens=28, prompt_tokens=20, max_wait_s=2.0)
        wait_s = dispatcher.estimate_wait_s(late)
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(late)
        for slot in slots:
            slot.release()
        await flow.aclose()
    assert refused.value.reason == "wait_too_long"
    assert wait_s == pytest.approx(41 / 8)
    # Seven places free 0.5 s from now (a learnt service from their grant), the eighth at 0.79 s,
    # and each again a second later: the forty-first frees 0.5 + 5 s from now.
    assert refused.value.retry_after_s == pytest.approx(0.5 + 5 * 1.0)


@pytest.mark.anyio
async def test_a_returning_user_first_in_line_with_room_is_not_told_its_wait_is_too_long(
    make_dispatcher: MakeDispatcher,
) -> None:
    """A paid chat client's reply ends beside three other paid users' running ones while a free
    request waits for the reserve: nothing of its tier or above waits and the replica has room for
    its next request, which is placed at once. Its user's lead over the tier's virtual time
    (FairQueue.lead_waits: three dispatches, one per other active user) was counted as a wait all
    the same, 13 s at a 10 s service time, and the precheck refused it 429 wait_too_long."""
    now = [0.0]
    replica = ControlledUpstream("r1", kv_tokens_total=1000, max_sequences=10)
    async with make_dispatcher(
        [replica], reserved_paid_fraction=0.5, prior_service_s=10.0, clock=lambda: now[0]
    ) as dispatcher:
        flow = Flow(dispatcher)
        chat = flow.submit(ticket("chat", paid=True))
        for i in range(3):
            flow.submit(ticket(f"paid-{i}", paid=True))
        await flow.settle()
        free = flow.submit(ticket("free", kv_tokens=300))  # 600 or more passes the unreserved 500
        await flow.settle()
        assert not free.done() and dispatcher.queue_depth() == 1

        now[0] += 10.0
        reply = chat.result()
        reply.grow(16)
        reply.mark_finished()
        reply.release()
        await flow.settle()

        again = ticket("chat", paid=True, max_wait_s=5.0)
        dispatcher.precheck(again)
        assert dispatcher.estimate_wait_s(again) == 0.0
        slot = await dispatcher.acquire(again)  # placed at once, as the estimate said
        assert not free.done() and dispatcher.queue_depth() == 1
        slot.release()
        await flow.aclose()


@pytest.mark.anyio
async def test_a_short_request_after_a_long_one_is_not_told_its_wait_is_too_long(
    make_dispatcher: MakeDispatcher,
) -> None:
    """One place, 10 s a request. A user's 1,020-token request ends beside two users queueing
    requests alike; its next is a 21-token ping, which two requests go before (one of each). Its
    lead over the tier's virtual time (680) was counted in pings (32 per other user), where each
    end moves it by the 1,020 tokens the others' requests cost: 68 dispatches, 680 s, refused 429
    wait_too_long against a wait of 30 s."""
    now = [0.0]
    replica = ControlledUpstream("r1", max_sequences=1, kv_tokens_total=100_000)
    async with make_dispatcher([replica], prior_service_s=10.0, clock=lambda: now[0]) as dispatcher:
        flow = Flow(dispatcher)
        flow.submit(ticket("x", kv_tokens=1020))
        for _ in range(3):
            for user in ("a", "b"):
                flow.submit(ticket(user, kv_tokens=1020))
        await flow.settle()

        async def serve_oldest() -> None:
            now[0] += 10.0
            flow.held()[0].grow(1000)
            await flow.release_oldest()

        await serve_oldest()
        ping = ticket("x", kv_tokens=21, max_wait_s=60.0)
        dispatcher.precheck(ping)
        flow.submit(ping)
        await flow.settle()
        while not flow.tasks[-1].done():
            await serve_oldest()
        assert [s.ticket.user for s in flow.granted()] == ["x", "a", "b", "a", "x"]
        await flow.aclose()


@pytest.mark.anyio
async def test_a_short_request_after_a_long_one_is_not_refused_while_a_higher_tier_holds_the_place(
    make_dispatcher: MakeDispatcher,
) -> None:
    """As above, but a paid request takes the one place when the user's 1,020-token request ends,
    so nothing of the free tier runs when the 21-token ping comes: its lead over the tier's virtual
    time (680) was counted in its own cost again, 65 dispatches, 680 s, refused 429 wait_too_long
    with max_wait_s 60, where the paid request and one request of each other user go before it."""
    now = [0.0]
    replica = ControlledUpstream("r1", max_sequences=1, kv_tokens_total=100_000)
    async with make_dispatcher([replica], prior_service_s=10.0, clock=lambda: now[0]) as dispatcher:
        flow = Flow(dispatcher)
        flow.submit(ticket("x", kv_tokens=1020))
        for _ in range(3):
            for user in ("a", "b"):
                flow.submit(ticket(user, kv_tokens=1020))
        flow.submit(ticket("p", paid=True, kv_tokens=100))
        await flow.settle()

        async def serve_oldest() -> None:
            now[0] += 10.0
            flow.held()[0].grow(1000)
            await flow.release_oldest()

        await serve_oldest()
        assert [s.ticket.user for s in flow.held()] == ["p"]
        ping = ticket("x", kv_tokens=21, max_wait_s=60.0)
        dispatcher.precheck(ping)
        flow.submit(ping)
        await flow.settle()
        while not flow.tasks[-1].done():
            await serve_oldest()
        assert [s.ticket.user for s in flow.granted()] == ["x", "p", "a", "b", "x"]
        await flow.aclose()
