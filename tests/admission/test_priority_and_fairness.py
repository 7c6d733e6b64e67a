"""Order of service: paid before free, equal service between users of a tier, the paid reserve."""

from __future__ import annotations

import pytest

from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket
from tests.admission.replicas import ControlledUpstream


@pytest.mark.anyio
async def test_paid_requests_go_ahead_of_every_waiting_free_request(make_dispatcher: MakeDispatcher) -> None:
    replica = ControlledUpstream("r1", max_sequences=3)
    async with make_dispatcher([replica]) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(40):
            flow.submit(ticket(f"free-{i % 12}"))
        await flow.settle()
        assert dispatcher.queue_depth() == 37

        # A trickle of paid requests during the flood: each one is the next to be served.
        for burst in (1, 2, 1, 3):
            paid = [flow.submit(ticket(f"paid-{i}", paid=True)) for i in range(burst)]
            await flow.settle()
            for _ in range(burst):
                await flow.release_oldest()
            assert all(task.done() for task in paid)
            assert all(slot.ticket.priority == 10 for slot in flow.granted()[-burst:])
        await flow.aclose()


@pytest.mark.anyio
async def test_two_free_users_at_ten_to_one_demand_get_equal_service(make_dispatcher: MakeDispatcher) -> None:
    replica = ControlledUpstream("r1", max_sequences=2)
    async with make_dispatcher([replica], fair_quantum_kv_tokens=256) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(110):
            flow.submit(ticket("heavy" if i % 11 else "light", kv_tokens=128))
        await flow.settle()
        while sum(s.ticket.user == "light" for s in flow.granted()) < 10:
            await flow.release_oldest()
        # While both were backlogged: count what each got.
        light = sum(s.ticket.user == "light" for s in flow.granted())
        heavy = sum(s.ticket.user == "heavy" for s in flow.granted())
        assert abs(heavy - light) <= 0.2 * max(heavy, light)
        await flow.aclose()


@pytest.mark.anyio
async def test_free_never_takes_the_reserved_share(make_dispatcher: MakeDispatcher) -> None:
    replica = ControlledUpstream("r1", kv_tokens_total=1000, max_sequences=10)
    async with make_dispatcher([replica], reserved_paid_fraction=0.2) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(30):
            flow.submit(ticket(f"free-{i % 5}", kv_tokens=150 if i % 2 else 50))
        await flow.settle()
        for _ in range(20):
            free_kv = sum(s.kv_charge for s in flow.held())
            free_seqs = len(flow.held())
            assert free_kv <= 800 and free_seqs <= 8
            await flow.release_oldest()

        # A paid request behind the blocked free ones still gets the reserve at once.
        paid = flow.submit(ticket("paid-1", paid=True, kv_tokens=150))
        await flow.settle()
        assert paid.done() and paid.result().ticket.user == "paid-1"
        await flow.aclose()


@pytest.mark.anyio
async def test_free_blocked_by_the_reserve_does_not_block_paid_in_the_queue(
    make_dispatcher: MakeDispatcher,
) -> None:
    replica = ControlledUpstream("r1", kv_tokens_total=1000, max_sequences=10)
    async with make_dispatcher([replica], reserved_paid_fraction=0.5) as dispatcher:
        flow = Flow(dispatcher)
        # Paid fills the whole replica; free then queues behind.
        paid_holders = [flow.submit(ticket(f"paid-{i}", paid=True, kv_tokens=100)) for i in range(10)]
        await flow.settle()
        free = [flow.submit(ticket(f"free-{i}")) for i in range(3)]
        late_paid = flow.submit(ticket("paid-late", paid=True))
        await flow.settle()
        assert dispatcher.queue_depth() == 4

        # One slot frees: free may not take it (the replica is above its unreserved half), paid does.
        paid_holders[0].result().release()
        await flow.settle()
        assert late_paid.done()
        assert not any(task.done() for task in free)
        await flow.aclose()


@pytest.mark.anyio
async def test_a_large_request_is_not_overtaken_by_smaller_ones(make_dispatcher: MakeDispatcher) -> None:
    replica = ControlledUpstream("r1", kv_tokens_total=1000, max_sequences=20)
    async with make_dispatcher([replica]) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(10):
            flow.submit(ticket(f"holder-{i}", kv_tokens=100))
        await flow.settle()
        large = flow.submit(ticket("large", kv_tokens=900))
        small = [flow.submit(ticket(f"small-{i % 4}", kv_tokens=100)) for i in range(12)]
        await flow.settle()

        # Each release frees room a small request would fit in; it is kept for the large one.
        for _ in range(8):
            await flow.release_oldest()
            assert not any(task.done() for task in small)
        await flow.release_oldest()
        assert large.done()
        await flow.aclose()
