"""Random arrivals, completions, cancellations and replica failures: the room rules always hold."""

from __future__ import annotations

import random

import pytest

from edge.admission import Slot, Ticket
from edge.admission.replica import Replica
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket, until
from tests.admission.replicas import ControlledUpstream

RESERVE = 0.25
BLOCK = 16  # the replicas report none: the dispatcher charges in blocks of this


def has_room(replica: Replica, held: list[Slot], t: Ticket) -> bool:
    """Room for `t` by what the test counts as held (the slots it holds), against the limits the
    replica declares: its block rounding and its share arithmetic are production's, not re-written
    here with other rounding; what is held is counted independently of the dispatcher."""
    mine = [s for s in held if s.upstream is replica.upstream]
    kv_limit = replica.kv_limit(t.may_use_reserve, RESERVE)
    sequence_limit = replica.sequence_limit(t.may_use_reserve, RESERVE)
    return sum(s.kv_charge for s in mine) + replica.charge(t.kv_tokens) <= kv_limit and (
        len(mine) + 1 <= sequence_limit
    )


@pytest.mark.anyio
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_room_rules_hold_under_random_traffic(make_dispatcher: MakeDispatcher, seed: int) -> None:
    rng = random.Random(seed)
    replicas = [
        ControlledUpstream("a", kv_tokens_total=2000, max_sequences=6),
        ControlledUpstream("b", kv_tokens_total=1200, max_sequences=10),
    ]
    async with make_dispatcher(replicas, reserved_paid_fraction=RESERVE, kv_block_tokens=BLOCK) as dispatcher:
        flow = Flow(dispatcher)
        tickets: dict[int, Ticket] = {}
        suspect: set[str] = set()
        for _ in range(300):
            roll = rng.random()
            if roll < 0.5:
                t = ticket(f"u{rng.randrange(8)}", paid=rng.random() < 0.3, kv_tokens=rng.randrange(20, 700))
                tickets[id(flow.submit(t))] = t
            elif roll < 0.85 and flow.held():
                slot = rng.choice(flow.held())
                failed = rng.random() < 0.05
                slot.release(failed=failed)
                if failed:
                    suspect.add(slot.upstream.name)
            elif roll < 0.95:
                waiting = [t for t in flow.tasks if not t.done()]
                if waiting:
                    victim = rng.choice(waiting)
                    victim.cancel()
                    await until(victim.done)
            else:
                await dispatcher.check_replicas()  # the replicas are healthy: failed marks clear
                suspect.clear()
            await flow.settle()

            held = flow.held()
            for replica in replicas:
                mine = [s for s in held if s.upstream is replica]
                free = [s for s in mine if not s.ticket.may_use_reserve]
                assert sum(s.kv_charge for s in mine) <= replica.kv_tokens_total
                assert len(mine) <= replica.max_sequences
                assert sum(s.kv_charge for s in free) <= (1 - RESERVE) * replica.kv_tokens_total
                assert len(free) <= (1 - RESERVE) * replica.max_sequences

            # Work-conserving: a ticket waits although a replica has room for it only when an earlier
            # ticket of its tier or a higher one, which that replica cannot take yet, holds the room.
            waiting = [tickets[id(t)] for t in flow.tasks if not t.done()]
            for t in waiting:
                for member in dispatcher.replicas.members:
                    if member.name in suspect or not has_room(member, held, t):
                        continue
                    assert any(
                        b is not t
                        and b.priority >= t.priority
                        and (b.may_use_reserve or not t.may_use_reserve)
                        and not has_room(member, held, b)
                        for b in waiting
                    ), f"{t.request_id} waits while {member.name} has room"
        await flow.aclose()
