"""Prefix-aware routing: a conversation's next turn goes where its history is cached, unless that
replica is busier by more than the cache is worth or has no room at all."""

from __future__ import annotations

import dataclasses

import pytest

from edge.admission import Ticket
from edge.admission.prefix_index import MAX_ROUTING_BLOCKS, ROUTING_BLOCK_TOKENS, PrefixIndex, routing_hashes
from edge.upstreams.base import Capacity
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket, until
from tests.admission.replicas import ControlledUpstream

B = ROUTING_BLOCK_TOKENS


def _turn(history: list[int], kv_tokens: int = 100, user: str = "u") -> Ticket:
    return dataclasses.replace(ticket(user, kv_tokens=kv_tokens), prefix_keys=routing_hashes(history))


def test_routing_keys_name_whole_prefixes() -> None:
    prompt = list(range(5 * B + 3))
    keys = routing_hashes(prompt)
    assert len(keys) == 5
    assert routing_hashes([*prompt, 7, 8])[:5] == keys  # a later turn extends the same chain
    assert not set(routing_hashes([99, *prompt[1:]])) & set(keys)  # one token changed: nothing shared
    assert len(routing_hashes([1] * (MAX_ROUTING_BLOCKS + 5) * B)) == MAX_ROUTING_BLOCKS


def test_routing_keys_follow_the_cache_salt() -> None:
    """A replica holds a prefix only for requests of the same salt: the router must not count a
    prompt as cached because another user (another salt) sent it."""
    prompt = list(range(5 * B))
    mine = routing_hashes(prompt, "salt-a")
    assert routing_hashes(prompt, "salt-a") == mine and len(mine) == 5
    assert not set(routing_hashes(prompt, "salt-b")) & set(mine)
    assert not set(routing_hashes(prompt)) & set(mine)
    assert routing_hashes(prompt, "") == routing_hashes(prompt)


def test_the_index_is_bounded_and_forgets_tails_and_old_prompts_first() -> None:
    index = PrefixIndex(max_blocks=6)
    old, new = routing_hashes([1] * 4 * B), routing_hashes([2] * 4 * B)
    index.record(old)
    assert index.overlap(old) == 4
    index.record(new)
    assert len(index) == 6 and index.overlap(new) == 4
    assert index.overlap(old) == 2  # the old prompt's tail went first, its head is still there
    index.resize(3)
    assert index.overlap(new) == 3 and index.overlap(old) == 0


@pytest.mark.anyio
async def test_a_conversations_turns_return_to_the_replica_holding_their_history(
    make_dispatcher: MakeDispatcher,
) -> None:
    replicas = [ControlledUpstream(f"r{i}", kv_tokens_total=10_000) for i in range(2)]
    async with make_dispatcher(replicas, prefix_weight=2.0) as dispatcher:
        flow = Flow(dispatcher)
        histories = {c: [c] * (8 * B) for c in (10, 20, 30, 40)}
        # First turns, all at once: least loaded placement spreads them.
        for c, history in histories.items():
            flow.submit(_turn(history, user=f"u{c}"))
        await flow.settle()
        home = {slot.ticket.user: slot.replica.name for slot in flow.granted()}
        assert sorted(home.values()) == ["r0", "r0", "r1", "r1"]
        for slot in flow.held():
            slot.release()
        # Later turns resend the history plus the reply: each goes home, whatever the order.
        for c in (40, 10, 30, 20):
            flow.submit(_turn(histories[c] + [c + 1] * (3 * B), user=f"u{c}"))
        await flow.settle()
        assert {s.ticket.user: s.replica.name for s in flow.held()} == home
        await flow.aclose()


@pytest.mark.anyio
async def test_without_the_weight_routing_ignores_the_cache(make_dispatcher: MakeDispatcher) -> None:
    replicas = [ControlledUpstream(f"r{i}", kv_tokens_total=10_000) for i in range(2)]
    async with make_dispatcher(replicas, prefix_weight=0.0) as dispatcher:
        flow = Flow(dispatcher)
        history = [5] * (8 * B)
        flow.submit(_turn(history))
        await flow.settle()
        (first,) = flow.held()
        flow.submit(_turn(history))  # same prefix, but the other replica is emptier
        await flow.settle()
        second = flow.held()[1]
        assert second.replica is not first.replica
        await flow.aclose()


@pytest.mark.anyio
async def test_the_cache_does_not_outweigh_a_much_busier_replica(make_dispatcher: MakeDispatcher) -> None:
    replicas = [ControlledUpstream(f"r{i}", kv_tokens_total=10_000) for i in range(2)]
    async with make_dispatcher(replicas, prefix_weight=2.0) as dispatcher:
        flow = Flow(dispatcher)
        history = [5] * (8 * B)  # 128 cached tokens: worth 256 tokens of load
        flow.submit(_turn(history))
        await flow.settle()
        home = flow.held()[0].replica
        # A filler makes the other replica the busier one, so that a big request then lands at home.
        flow.submit(_turn([], kv_tokens=200, user="filler"))
        await flow.settle()
        filler = flow.held()[1]
        assert filler.replica is not home
        flow.submit(_turn([7] * (20 * B), kv_tokens=1500, user="big"))  # 1,500 tokens: lands at home
        await flow.settle()
        assert flow.held()[2].replica is home
        # Home now holds 1,600 tokens against 200: the cached 128 (x2) no longer make up for it.
        flow.submit(_turn(history + [6] * B))
        await flow.settle()
        assert flow.held()[3].replica is not home
        await flow.aclose()


@pytest.mark.anyio
async def test_stickiness_never_waits_for_a_full_replica_while_another_has_room(
    make_dispatcher: MakeDispatcher,
) -> None:
    replicas = [ControlledUpstream(f"r{i}", kv_tokens_total=1_000, max_sequences=2) for i in range(2)]
    async with make_dispatcher(replicas, prefix_weight=100.0) as dispatcher:
        flow = Flow(dispatcher)
        history = [5] * (8 * B)
        for _ in range(2):
            flow.submit(_turn(history))
        await flow.settle()
        homes = {slot.replica.name for slot in flow.held()}
        assert len(homes) == 1  # a huge weight keeps the shared prefix together while there is room
        flow.submit(_turn(history))  # its home is full (2 sequences): the other replica takes it
        await flow.settle()
        assert dispatcher.queue_depth() == 0
        assert flow.held()[2].replica.name not in homes
        await flow.aclose()


@pytest.mark.anyio
async def test_a_restarted_replica_is_known_to_hold_nothing(make_dispatcher: MakeDispatcher) -> None:
    class Reporting(ControlledUpstream):
        hits = 5_000  # the replica's running total of prefix-cache hits

        async def capacity(self) -> Capacity:
            return dataclasses.replace(await super().capacity(), prefix_hit_tokens=self.hits)

    replica = Reporting("r", kv_tokens_total=10_000)
    async with make_dispatcher([replica], prefix_weight=2.0) as dispatcher:
        flow = Flow(dispatcher)
        history = [5] * (8 * B)
        flow.submit(_turn(history))
        await flow.settle()
        state = flow.held()[0].replica
        assert state.cached_prefix_tokens(routing_hashes(history)) == 8 * B
        replica.hits = 0  # it restarted: its totals start again from 0, its cache is empty
        await until(lambda: state.capacity is not None and state.capacity.prefix_hit_tokens == 0)
        assert state.cached_prefix_tokens(routing_hashes(history)) == 0
        await flow.aclose()
