"""Real-use KV accounting: a request is charged what it holds so far plus a margin, growing as it
streams, instead of prompt + max_tokens for its whole life; the replica's preemption is the valve."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from edge.admission import Dispatcher, Ticket
from edge.admission.real_use import RealUse
from edge.upstreams.base import GenerationRequest
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket, until
from tests.admission.replicas import ControlledUpstream


def _request(user: str, prompt: int, max_new: int, *, paid: bool = False) -> Ticket:
    t = ticket(user, paid=paid, kv_tokens=prompt + max_new)
    return dataclasses.replace(t, prompt_tokens=prompt)


@pytest.mark.anyio
async def test_real_use_admits_what_worst_case_would_keep_waiting(make_dispatcher: MakeDispatcher) -> None:
    for real_use, running in ((None, 1), (RealUse(margin_tokens=100), 5)):
        replica = ControlledUpstream("r", kv_tokens_total=1_000, max_sequences=8)
        async with make_dispatcher([replica], real_use=real_use) as dispatcher:
            flow = Flow(dispatcher)
            for i in range(6):
                flow.submit(_request(f"u{i}", prompt=100, max_new=800))  # worst case 900 tokens each
            await flow.settle()
            assert len(flow.held()) == running
            await flow.aclose()


@pytest.mark.anyio
async def test_the_precheck_judges_room_by_the_charge_placement_makes(
    make_dispatcher: MakeDispatcher,
) -> None:
    """One stream holds a fifth of the replica: a newcomer charged as much is placed at once, so the
    precheck before it must not refuse it on its worst case (prompt + max_tokens, which does not
    fit beside the first) with a wait estimated from the service time."""
    now = [0.0]
    replica = ControlledUpstream("r", kv_tokens_total=1_000, max_sequences=8)
    real_use = RealUse(margin_tokens=100)
    async with make_dispatcher([replica], real_use=real_use, clock=lambda: now[0]) as dispatcher:
        first = await dispatcher.acquire(_request("x", prompt=100, max_new=800))
        now[0] += 40.0  # a 40 s reply: the service time the estimate divides by
        first.release()
        holder = await dispatcher.acquire(_request("a", prompt=100, max_new=800))
        newcomer = dataclasses.replace(_request("b", prompt=100, max_new=800), max_wait_s=30.0)

        assert dispatcher.estimate_wait_s(newcomer) == 0.0
        dispatcher.precheck(newcomer)  # 429 wait_too_long, Retry-After 40 s before
        slot = await dispatcher.acquire(newcomer)
        assert slot.replica.kv_in_use == 400
        slot.release()
        holder.release()


@pytest.mark.anyio
async def test_a_request_bigger_than_this_edges_share_still_runs(make_dispatcher: MakeDispatcher) -> None:
    """Four edges share a replica: the worst case of a long request exceeds one edge's share, what it
    is charged does not; the replica's own preemption covers its growth, as for every stream."""
    replica = ControlledUpstream("r", kv_tokens_total=65_536, max_sequences=256)
    async with make_dispatcher([replica], replica_share=0.25, real_use=RealUse(256)) as dispatcher:
        request = _request("paid", prompt=2_000, max_new=16_000, paid=True)  # 18,000 > 16,384
        dispatcher.precheck(request)  # 503 no_replica before, on every retry
        slot = await dispatcher.acquire(request)
        assert slot.kv_charge == 2_256
        slot.release()


@pytest.mark.anyio
async def test_free_streams_grown_into_the_reserve_do_not_keep_paid_waiting(
    make_dispatcher: MakeDispatcher,
) -> None:
    """Four free streams fill the free share at placement and grow past it, into the reserve, as
    they stream. A paid request is placed at once all the same (the replica preempts the free
    overrun first), while a free newcomer still waits."""
    replica = ControlledUpstream("r", kv_tokens_total=1_000, max_sequences=10)
    real_use = RealUse(margin_tokens=100)
    async with make_dispatcher([replica], reserved_paid_fraction=0.2, real_use=real_use) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(4):  # 100 + 100 each: 800, the whole unreserved share
            flow.submit(_request(f"free-{i}", prompt=100, max_new=700))
        await flow.settle()
        assert len(flow.held()) == 4
        for slot in flow.held():
            slot.grow(60)  # 260 each: 1,040 of 1,000, the reserve taken by free work
        assert flow.held()[0].replica.kv_in_use == 1_040

        free = flow.submit(_request("free-late", prompt=50, max_new=100))
        paid = flow.submit(_request("paid", prompt=50, max_new=100, paid=True))
        await flow.settle()
        assert paid.done() and not free.done()  # paid waited behind the free streams before
        await flow.aclose()


@pytest.mark.anyio
async def test_the_charge_follows_the_stream_a_margin_ahead_in_whole_blocks(
    make_dispatcher: MakeDispatcher,
) -> None:
    replica = ControlledUpstream("r", kv_tokens_total=1_024, max_sequences=8, kv_block_tokens=16)
    async with make_dispatcher([replica], real_use=RealUse(margin_tokens=50)) as dispatcher:
        flow = Flow(dispatcher)
        flow.submit(_request("u", prompt=100, max_new=300))
        await flow.settle()
        (slot,) = flow.held()
        state = slot.replica
        assert slot.kv_charge == 160 == state.kv_in_use  # 100 + 50, in whole blocks
        slot.grow(10)  # 160 still covers 110 held + 50
        assert slot.kv_charge == 160
        slot.grow(11)
        assert slot.kv_charge == 176 == state.kv_in_use
        slot.grow(400)  # never beyond the worst case
        assert slot.kv_charge == 400 and state.kv_in_use == 400
        slot.release()
        assert state.kv_in_use == 0
        slot.grow(500)  # a released slot charges nothing any more
        assert state.kv_in_use == 0
        await flow.aclose()


@pytest.mark.anyio
async def test_growing_streams_hold_back_new_admissions(make_dispatcher: MakeDispatcher) -> None:
    replica = ControlledUpstream("r", kv_tokens_total=1_000, max_sequences=8)
    async with make_dispatcher([replica], real_use=RealUse(margin_tokens=100)) as dispatcher:
        flow = Flow(dispatcher)
        for i in range(2):
            flow.submit(_request(f"u{i}", prompt=100, max_new=800))
        await flow.settle()
        for slot in flow.held():
            slot.grow(300)  # each now holds 400 + 100 margin: the replica is full
        flow.submit(_request("late", prompt=100, max_new=800))
        await flow.settle()
        assert dispatcher.queue_depth() == 1
        await flow.release_oldest()
        assert dispatcher.queue_depth() == 0
        await flow.aclose()


@pytest.mark.anyio
async def test_a_ticket_without_a_known_prompt_is_charged_its_worst_case(
    make_dispatcher: MakeDispatcher,
) -> None:
    replica = ControlledUpstream("r", kv_tokens_total=1_000)
    async with make_dispatcher([replica], real_use=RealUse(margin_tokens=10)) as dispatcher:
        flow = Flow(dispatcher)
        flow.submit(ticket("u", kv_tokens=900))
        await flow.settle()
        assert flow.held()[0].kv_charge == 900
        await flow.aclose()


@pytest.mark.anyio
async def test_on_a_real_engine_overcommitted_streams_are_preempted_and_finish_unchanged(
    tmp_path: Path,
) -> None:
    # 12 blocks x 16 tokens. Each request may reach 30 + 60 = 90 tokens (6 blocks): worst-case
    # accounting would run two at a time. Real use starts each at 30 + 16 and lets five run: as they
    # grow the engine runs out of blocks and preempts (lowest tier first); the streams just pause.
    config = EngineConfig(block_size=16, num_blocks=12, max_num_seqs=8, max_num_batched_tokens=256)
    engine = LLMEngine.from_pretrained(build_demo_model(tmp_path / "demo"), config)
    engine.start()
    upstream = AsyncEngine(engine, "engine")
    dispatcher = Dispatcher(
        [upstream], reserved_paid_fraction=0.0, max_queue=100, poll_interval_s=0.01, real_use=RealUse(16)
    )
    await dispatcher.start()
    prompts = {f"r{i}": list(range(10 + i, 40 + i)) for i in range(5)}
    most_running = 0

    async def stream(rid: str, priority: int) -> list[int]:
        nonlocal most_running
        t = dataclasses.replace(_request(rid, 30, 60, paid=priority > 0), request_id=rid)
        slot = await dispatcher.acquire(t)
        most_running = max(most_running, sum(r.sequences for r in dispatcher.replicas.members))
        request = GenerationRequest(rid, prompts[rid], 60, temperature=0.0, priority=priority)
        tokens: list[int] = []
        try:
            async for delta in slot.upstream.generate(request):
                tokens += delta.token_ids
                slot.grow(len(tokens))
        finally:
            slot.release()
        return tokens

    try:
        alone = {rid: await stream(rid, 0) for rid in prompts}
        await until(lambda: engine.stats().running == 0, poll_s=0.001)  # an engine thread: no GIL spin
        before = engine.stats().preemptions
        together = await asyncio.gather(*(stream(rid, i % 2) for i, rid in enumerate(prompts)))
        stats = engine.stats()
    finally:
        await dispatcher.aclose()
        await upstream.aclose()
    assert most_running >= 4
    assert stats.preemptions > before
    assert dict(zip(prompts, together, strict=True)) == alone  # nobody noticed, except in time
