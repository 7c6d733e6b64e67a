"""Replicas joining and leaving a running dispatcher (what replica discovery drives)."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from edge.admission import NeverFits, Overloaded
from edge.upstreams.base import GenerationRequest
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket, until
from tests.admission.replicas import ControlledUpstream


class ClosableUpstream(ControlledUpstream):
    """A controlled replica that records being closed and refuses to generate afterwards."""

    def __init__(self, name: str, **options: int) -> None:
        super().__init__(name, **options)
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


async def _generate(upstream: ClosableUpstream, request_id: str) -> list[int]:
    assert not upstream.closed, "a draining replica was closed under an in-flight stream"
    tokens: list[int] = []
    async for delta in upstream.generate(GenerationRequest(request_id, [1, 2, 3], 2)):
        tokens += delta.token_ids
    return tokens


@pytest.mark.anyio
async def test_an_added_replica_takes_the_tickets_waiting_for_room(make_dispatcher: MakeDispatcher) -> None:
    full = ClosableUpstream("full", max_sequences=1)
    async with make_dispatcher([full]) as dispatcher:
        flow = Flow(dispatcher)
        holder = await dispatcher.acquire(ticket("u0"))
        waiting = [flow.submit(ticket(f"u{i}")) for i in range(1, 4)]
        await until(lambda: dispatcher.queue_depth() == 3)

        await dispatcher.add_upstream(ClosableUpstream("fresh", max_sequences=3))

        slots = await asyncio.wait_for(asyncio.gather(*waiting), 5.0)
        assert [s.upstream.name for s in slots] == ["fresh"] * 3
        assert dispatcher.queue_depth() == 0
        assert dispatcher.upstream_names() == ["full", "fresh"]
        for slot in [holder, *slots]:
            slot.release()


@pytest.mark.anyio
async def test_a_removed_replica_finishes_its_streams_takes_no_new_ones_then_closes(
    make_dispatcher: MakeDispatcher,
) -> None:
    leaving = ClosableUpstream("leaving")
    staying = ClosableUpstream("staying")
    async with make_dispatcher([leaving, staying]) as dispatcher:
        in_flight = [await dispatcher.acquire(ticket(f"u{i}")) for i in range(4)]
        on_leaving = [s for s in in_flight if s.upstream is leaving]
        assert on_leaving, "the router spreads four tickets over both replicas"

        dispatcher.remove_upstream("leaving")

        assert dispatcher.upstream_names() == ["staying"]
        later = [await dispatcher.acquire(ticket(f"v{i}")) for i in range(6)]
        assert {s.upstream.name for s in later} == {"staying"}
        for slot in on_leaving[:-1]:
            assert await _generate(leaving, slot.ticket.request_id) == [1, 2]
            slot.release()
        assert not leaving.closed, "closed while a generation was still in flight"
        assert await _generate(leaving, on_leaving[-1].ticket.request_id) == [1, 2]
        on_leaving[-1].release()
        await until(lambda: leaving.closed)
        assert not staying.closed
        for slot in [*in_flight, *later]:
            slot.release()


@pytest.mark.anyio
async def test_an_idle_removed_replica_closes_at_once_and_its_name_may_return(
    make_dispatcher: MakeDispatcher,
) -> None:
    old = ClosableUpstream("replica-a")
    async with make_dispatcher([old]) as dispatcher:
        dispatcher.remove_upstream("replica-a")
        await until(lambda: old.closed)
        with pytest.raises(Overloaded) as refused:
            dispatcher.precheck(ticket("u0"))
        assert refused.value.reason == "no_replica"

        back = ClosableUpstream("replica-a")
        await dispatcher.add_upstream(back)
        slot = await dispatcher.acquire(ticket("u1"))
        assert slot.upstream is back
        slot.release()
        with pytest.raises(ValueError):
            await dispatcher.add_upstream(ClosableUpstream("replica-a"))
        with pytest.raises(KeyError):
            dispatcher.remove_upstream("never-there")


@pytest.mark.anyio
async def test_waiters_only_a_removed_replica_could_hold_fail_as_never_fits(
    make_dispatcher: MakeDispatcher,
) -> None:
    """No replica left could hold it, even empty: the 400 a new request gets (NeverFits), not a
    no_replica whose retry alone said so."""
    big = ClosableUpstream("big", kv_tokens_total=10_000, max_sequences=1)
    small = ClosableUpstream("small", kv_tokens_total=100)
    async with make_dispatcher([big, small]) as dispatcher:
        holder = await dispatcher.acquire(ticket("u0", kv_tokens=5_000))
        assert holder.upstream is big
        waiter = asyncio.create_task(dispatcher.acquire(ticket("u1", kv_tokens=5_000)))
        await until(lambda: dispatcher.queue_depth() == 1)

        dispatcher.remove_upstream("big")

        with pytest.raises(NeverFits) as failed:
            await asyncio.wait_for(waiter, 5.0)
        assert (failed.value.kv_tokens, failed.value.kv_limit) == (5_000, 100)
        holder.release()
        await until(lambda: big.closed)


@pytest.mark.anyio
async def test_closing_the_dispatcher_closes_draining_replicas(make_dispatcher: MakeDispatcher) -> None:
    draining = ClosableUpstream("draining")
    async with make_dispatcher([draining]) as dispatcher:
        slot = await dispatcher.acquire(ticket("u0"))
        dispatcher.remove_upstream("draining")
        assert not draining.closed
    assert draining.closed
    slot.release()  # a late release after close must not fail


@pytest.mark.anyio
async def test_a_drained_replicas_close_names_no_request(make_dispatcher: MakeDispatcher) -> None:
    """A removed replica closes once its last stream gives its slot back, in a task of its own:
    started from that request's task, it ran in its context, and `replica_closed` (or
    `replica_close_failed`), the replica's lines, carried the request_id of whichever stream ended
    last on it."""
    leaving = ClosableUpstream("leaving")
    async with make_dispatcher([leaving, ClosableUpstream("staying")]) as dispatcher:
        slots = [await dispatcher.acquire(ticket(f"u{i}")) for i in range(2)]
        [last] = [s for s in slots if s.upstream is leaving]
        dispatcher.remove_upstream("leaving")

        async def request_ends() -> None:
            structlog.contextvars.bind_contextvars(request_id="chatcmpl-last")  # as the pipeline binds it
            last.release()

        with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            await asyncio.create_task(request_ends())  # its own task, as each request has
            await until(lambda: leaving.closed)  # and logged, in the same step of the close's task
        for slot in slots:
            if slot is not last:
                slot.release()
    [closed] = [e for e in logs if e["event"] == "replica_closed"]
    assert "request_id" not in closed, closed


@pytest.mark.anyio
async def test_the_context_is_the_smallest_sequence_limit_a_member_reports(
    make_dispatcher: MakeDispatcher,
) -> None:
    """A request may go to any member, so none may be sent past the smallest limit one reports; a
    member that reports none leaves it to the others (and to the settings)."""
    silent = ClosableUpstream("silent")
    roomy = ClosableUpstream("roomy")
    roomy.max_sequence_tokens = 4096
    async with make_dispatcher([silent, roomy]) as dispatcher:
        assert dispatcher.max_sequence_tokens == 4096
        short = ClosableUpstream("short")
        short.max_sequence_tokens = 1024
        await dispatcher.add_upstream(short)
        assert dispatcher.max_sequence_tokens == 1024
        # Rebuilt with another engine: its next poll says the new limit.
        short.max_sequence_tokens = 2048
        await dispatcher.check_replicas()
        assert dispatcher.max_sequence_tokens == 2048
        dispatcher.remove_upstream("short")
        assert dispatcher.max_sequence_tokens == 4096
