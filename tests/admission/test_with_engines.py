"""The dispatcher in front of real in-process engines (the demo model) as replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge.admission import Dispatcher, Ticket
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.admission.flow import counting_clock, ticket, until
from tests.admission.pipeline import generate_with_failover

ENGINE = EngineConfig(
    block_size=16, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=512
)
PROMPT = list(range(10, 40))  # 30 tokens; with 32 new ones a request is charged 64 KV tokens
MAX_NEW = 32
# The engines are threads of this process: look at their progress without spinning on the GIL.
ENGINE_POLL_S = 0.001


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("admission") / "demo-model")


@pytest.fixture
async def replicas(demo_dir: Path) -> AsyncIterator[list[AsyncEngine]]:
    upstreams = []
    for i in range(2):
        engine = LLMEngine.from_pretrained(demo_dir, ENGINE)
        engine.start()
        upstreams.append(AsyncEngine(engine, f"engine-{i}"))
    yield upstreams
    for upstream in upstreams:
        await upstream.aclose()


@dataclass
class Served:
    ticket: Ticket
    asked_at: float
    granted_at: float
    # Read before the slot is released: the release may grant the freed room to a waiting ticket
    # at once, so a clock reading after it would come later than that grant.
    freed_at: float
    tokens: list[int]


@pytest.mark.anyio
async def test_paid_trickle_through_a_free_flood_on_real_engines(replicas: list[AsyncEngine]) -> None:
    clock = counting_clock()
    dispatcher = Dispatcher(
        replicas, reserved_paid_fraction=0.25, max_queue=1000, clock=clock, kv_block_tokens=ENGINE.block_size
    )
    await dispatcher.start()
    served: list[Served] = []

    async def request(t: Ticket) -> None:
        asked_at = clock()  # acquire() enqueues before it first yields: no grant falls in between
        freed_at: list[float] = []
        slot, tokens = await generate_with_failover(
            dispatcher, t, PROMPT, MAX_NEW, before_release=lambda: freed_at.append(clock())
        )
        served.append(Served(t, asked_at, slot.granted_at, freed_at[0], tokens))

    def served_at_least(count: int) -> Callable[[], bool]:
        return lambda: len(served) >= count

    async with asyncio.TaskGroup() as group:
        for i in range(48):
            group.create_task(request(ticket(f"free-{i % 8}", kv_tokens=len(PROMPT) + MAX_NEW)))
        # Free may fill 3 of each replica's 4 sequences: 6 run, the rest queue.
        await until(lambda: dispatcher.queue_depth() == 42, poll_s=ENGINE_POLL_S)
        for _ in range(3):  # paid arrive in bursts larger than the reserve while the flood drains
            enough = served_at_least(len(served) + 3)
            for i in range(3):
                group.create_task(request(ticket(f"paid-{i}", paid=True, kv_tokens=len(PROMPT) + MAX_NEW)))
            await until(enough, poll_s=ENGINE_POLL_S)
    await dispatcher.aclose()

    assert len(served) == 57 and all(len(s.tokens) > 0 for s in served)
    free = [s for s in served if s.ticket.priority == 0]
    paid_served = [s for s in served if s.ticket.priority == 10]
    # A paid request waited when it got its slot only after some request freed one. Each burst is
    # larger than the reserve the flood leaves free (one sequence per replica), so one always waits.
    waited = [p for p in paid_served if any(p.asked_at < s.freed_at < p.granted_at for s in served)]
    assert waited, "the scenario must make paid requests queue behind the flood"
    for paid in paid_served:
        overtaking = [f for f in free if paid.asked_at < f.granted_at < paid.granted_at]
        assert overtaking == [], f"free requests were served while {paid.ticket.request_id} waited"


@pytest.mark.anyio
async def test_a_stopped_engine_fails_before_the_first_token_and_another_one_serves(
    replicas: list[AsyncEngine],
) -> None:
    broken, healthy = replicas
    await broken.aclose()  # the engine is stopped: every new request fails at once
    # Both idle: the first request goes to the first replica, the broken one.
    dispatcher = Dispatcher(replicas, reserved_paid_fraction=0.0, max_queue=10, poll_interval_s=3600)
    await dispatcher.start()
    try:
        for i in range(4):
            slot, tokens = await generate_with_failover(dispatcher, ticket(f"u{i}"), PROMPT, MAX_NEW)
            assert slot.upstream is healthy
            assert 0 < len(tokens) <= MAX_NEW
    finally:
        await dispatcher.aclose()
