"""Overload answers: a full queue, a wait estimated too long, a wait that ran too long, a cancelled wait."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from edge.admission import Dispatcher, Overloaded, Slot, Ticket
from edge.admission.wait_estimate import MIN_RETRY_S
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket, until
from tests.admission.replicas import ControlledUpstream


@pytest.mark.anyio
async def test_queue_full_is_overloaded_with_a_retry_after(make_dispatcher: MakeDispatcher) -> None:
    async with make_dispatcher([ControlledUpstream("r1", max_sequences=1)], max_queue=3) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(4):
            flow.submit(ticket(f"u{i}"))
        await flow.settle()
        assert dispatcher.queue_depth() == 3

        with pytest.raises(Overloaded) as precheck:
            dispatcher.precheck(ticket("late"))
        assert precheck.value.reason == "queue_full"
        assert precheck.value.retry_after_s > 0
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


def _reply(user: str, max_new: int, *, paid: bool = False, max_wait_s: float = 60.0) -> Ticket:
    """A ticket whose max_tokens the queue knows (the edge's always say their prompt tokens)."""
    t = ticket(user, paid=paid, kv_tokens=10 + max_new, max_wait_s=max_wait_s)
    return dataclasses.replace(t, prompt_tokens=10)


async def _one_reply_ran_to_its_end(dispatcher: Dispatcher, now: list[float]) -> None:
    """A short reply streams all its max_tokens: replies here run to their max_tokens (share 1)."""
    short = await dispatcher.acquire(_reply("warm", 10, paid=True))
    short.grow(1)
    now[0] += 0.05
    short.grow(10)
    short.release()


@pytest.mark.anyio
async def test_the_wait_is_when_the_held_streams_free_enough_room(make_dispatcher: MakeDispatcher) -> None:
    """Five paid streams of 1,000 tokens hold the replica, at 100 to 500 tokens a second. A paid
    ticket waits for the first of them to end; a free one for the second, as the paid reserve keeps
    one of the five places from it. Neither is judged by the short reply finished before (0.05 s)."""
    now = [0.0]
    replica = ControlledUpstream("r", max_sequences=5)
    async with make_dispatcher([replica], clock=lambda: now[0], reserved_paid_fraction=0.2) as dispatcher:
        await _one_reply_ran_to_its_end(dispatcher, now)
        streams: list[Slot] = [await dispatcher.acquire(_reply(f"p{i}", 1000, paid=True)) for i in range(5)]
        for slot in streams:
            slot.grow(1)
        now[0] += 1.0
        for i, slot in enumerate(streams, 1):
            slot.grow(1 + 100 * i)  # 999 - 100 i tokens left at 100 i a second
        # They end 1.0, 1.5, 2.33, 4.0 and 8.99 s from now.
        assert dispatcher.estimate_wait_s(_reply("paid", 5, paid=True)) == pytest.approx(1.0, abs=0.01)
        assert dispatcher.estimate_wait_s(_reply("free", 5)) == pytest.approx(1.5, abs=0.01)
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(_reply("free", 5, max_wait_s=1.0))
        assert refused.value.reason == "wait_too_long"
        assert refused.value.retry_after_s == pytest.approx(1.5, abs=0.01)
        for slot in streams:
            slot.release()


@pytest.mark.anyio
async def test_retry_after_is_never_a_burst_of_milliseconds(make_dispatcher: MakeDispatcher) -> None:
    """A stream at its max_tokens that has not given its place back yet is expected to free it now;
    the full queue's Retry-After still gives the retry MIN_RETRY_S, not the 0 ms that would make a
    client's retries arrive together, each refused."""
    now = [0.0]
    async with make_dispatcher(
        [ControlledUpstream("r", max_sequences=1)], clock=lambda: now[0], max_queue=1
    ) as dispatcher:
        await _one_reply_ran_to_its_end(dispatcher, now)
        holder = await dispatcher.acquire(_reply("holder", 100))
        holder.grow(1)
        now[0] += 1.0
        holder.grow(100)
        flow = Flow(dispatcher)
        flow.submit(_reply("queued", 5))
        await flow.settle()
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(_reply("late", 5))
        assert refused.value.reason == "queue_full"
        assert refused.value.retry_after_s == MIN_RETRY_S
        holder.release()
        await flow.aclose()
