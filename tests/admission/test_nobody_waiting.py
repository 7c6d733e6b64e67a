"""A ticket that finds nobody queued: placed at once where the queue would have placed it, and
never ahead of a ticket that is waiting."""

from __future__ import annotations

import pytest

from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket
from tests.admission.replicas import ControlledUpstream


@pytest.mark.anyio
async def test_with_nobody_queued_each_ticket_takes_the_least_loaded_replica(
    make_dispatcher: MakeDispatcher,
) -> None:
    replicas = [ControlledUpstream(name, kv_tokens_total=1000) for name in ("r1", "r2")]
    async with make_dispatcher(replicas) as dispatcher:
        first = ticket("a", kv_tokens=300)
        dispatcher.precheck(first)
        one = await dispatcher.acquire(first)
        two = await dispatcher.acquire(ticket("b", kv_tokens=100))
        three = await dispatcher.acquire(ticket("a", kv_tokens=100))
        assert one.upstream.name != two.upstream.name  # the emptier replica, each time
        assert three.upstream is two.upstream  # 200 of 1000 in use there, against 300
        assert dispatcher.queue_depth() == 0
        for slot in (one, two, three):
            slot.release()


@pytest.mark.anyio
async def test_a_ticket_that_fits_waits_behind_one_already_waiting(make_dispatcher: MakeDispatcher) -> None:
    replica = ControlledUpstream("r1", kv_tokens_total=1000)
    async with make_dispatcher([replica]) as dispatcher:
        flow = Flow(dispatcher)
        held = flow.submit(ticket("a", kv_tokens=700))
        big = flow.submit(ticket("b", kv_tokens=500))  # no room: waits
        await flow.settle()
        assert held.done() and not big.done()
        small = flow.submit(ticket("c", kv_tokens=100))  # room for it, but "b" waits first
        await flow.settle()
        assert not small.done() and dispatcher.queue_depth() == 2
        await flow.release_oldest()
        assert big.done() and small.done()
        assert [s.ticket.user for s in flow.granted()] == ["a", "b", "c"]
        await flow.aclose()
