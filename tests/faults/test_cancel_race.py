"""A cancel that meets a generation ending on its own gets one strict answer.

Regression (issue 13): a cancel arriving as a generation ended on its own answered 200 CANCELLED
although the stream ended with `stop`: the request stayed in the registry until its clean-up was
done, long after its outcome was decided. Now whichever comes first decides: a cancel after the end
answers 409 and the stream keeps its own finish reason; a cancel before it answers 200 and the
stream ends cancelled (edge/cancel/live.py). Across instances the store decides the same way
between a cancel and the request's settle (edge/cancel/bus.py; tests/edge/test_fleet.py has the
whole edge).

The race is made deterministic by holding the request's clean-up where the old registry still held
the request (its lease settle, which runs after the outcome is decided on this instance and before
the registry learns the finish): no sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from edge.cancel.bus import RedisCancelBus
from edge.cancel.outcome import CancelOutcome
from edge.cancel.registry import CancelRegistry
from edge.cancel.shared import SharedCancelRegistry
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.admitted import Admitter
from tests.support.holding_limiter import HOLD_TIMEOUT_S, HoldingLimiter, holding
from tests.support.live_server import LiveServer, start_server
from tests.support.redis_server import RedisServer, start_redis


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("cancel-race"), {"tiers": ROOMY_TIERS}) as live:
        yield live


@pytest.fixture
def held(server: LiveServer) -> Iterator[HoldingLimiter]:
    with holding(server) as holder:
        yield holder


def test_a_cancel_after_the_generation_ended_on_its_own_is_409(
    server: LiveServer, held: HoldingLimiter
) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
        with client.stream("POST", CHAT, json=body) as stream:
            items = events(stream)
            received: list[Any] = [next(items)]
            rid = received[0]["request_id"]
            # The generation ends on its own (4 tokens) and its clean-up is held: the closing
            # events wait for it (the client sees the end only once the lease is settled).
            assert held.settling.wait(HOLD_TIMEOUT_S)
            cancel = client.post(f"{CHAT}/{rid}/cancel")
            held.release.set()
            for item in items:
                received.append(item)
                if item == DONE:
                    break
        after = client.post(f"{CHAT}/{rid}/cancel")

    assert received[-1] == DONE
    final = [e for e in received if isinstance(e, dict) and e.get("choices")][-1]
    assert final["choices"][0]["finish_reason"] in ("length", "stop")
    assert "floodgate" not in final
    assert cancel.status_code == 409, cancel.text
    assert cancel.json()["error"]["code"] == "request_finished"
    assert after.status_code == 409


# -- the contract itself, on one instance's registry ----------------------------------------------


def test_a_cancel_before_the_end_decides_the_outcome() -> None:
    registry = CancelRegistry()
    live = registry.register("r1", "alice")

    assert registry.cancel_local("r1", "alice") is CancelOutcome.CANCELLED
    # The generation ended on its own right after: it must report itself cancelled.
    assert live.end() is True


def test_a_cancel_after_the_end_finds_it_finished_even_before_the_clean_up() -> None:
    registry = CancelRegistry()
    live = registry.register("r1", "alice")

    assert live.end() is False
    # Still registered (its clean-up is running) but its outcome is decided.
    assert registry.cancel_local("r1", "alice") is CancelOutcome.FINISHED
    assert registry.cancel_local("r1", "mallory") is CancelOutcome.NOT_FOUND
    registry.finish(live)
    assert registry.cancel_local("r1", "alice") is CancelOutcome.FINISHED


# -- across instances: the shared store decides the same way -------------------------------------


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
async def two_instances(redis_server: RedisServer) -> AsyncIterator[tuple[SharedCancelRegistry, ...]]:
    """Two edge instances' registries on one real Redis (each its own clients, as in a fleet)."""
    instances = [
        SharedCancelRegistry(CancelRegistry(), RedisCancelBus.from_url(redis_server.url)) for _ in range(2)
    ]
    for instance in instances:
        await instance.start()
    yield tuple(instances)
    for instance in instances:
        await instance.aclose()


@pytest.mark.anyio
async def test_across_instances_a_cancel_after_the_settle_is_finished(
    two_instances: tuple[SharedCancelRegistry, ...], redis_server: RedisServer, admitter: Admitter
) -> None:
    runs, other = two_instances
    admitted = await admitter.admit(redis_server.url, "r-end-first")  # live for every instance from here
    assert admitted.lease is not None
    live = runs.register("r-end-first", "alice")

    assert live.end() is False
    assert await admitted.lease.settle() is False  # no cancel reached the store first
    # The clean-up (finish) has not run yet: the store already says the generation is over.
    assert (await other.cancel("r-end-first", "alice")).outcome is CancelOutcome.FINISHED
    runs.finish(live)


@pytest.mark.anyio
async def test_across_instances_a_cancel_before_the_settle_decides_the_outcome(
    two_instances: tuple[SharedCancelRegistry, ...], redis_server: RedisServer, admitter: Admitter
) -> None:
    runs, other = two_instances
    admitted = await admitter.admit(redis_server.url, "r-cancel-first")  # live for every instance from here
    assert admitted.lease is not None
    live = runs.register("r-cancel-first", "alice")

    assert (await other.cancel("r-cancel-first", "alice")).outcome is CancelOutcome.CANCELLED
    live.end()  # True or False: whether the broadcast reached this instance yet
    # Either way its settle learns of the cancel: the stream ends cancelled (Generation._run).
    assert await admitted.lease.settle() is True
    # Repeated, the cancel answers as the first did (idempotent), though the request has ended.
    assert (await other.cancel("r-cancel-first", "alice")).outcome is CancelOutcome.CANCELLED
    runs.finish(live)


@pytest.mark.anyio
async def test_across_instances_a_cancel_the_running_instance_answered_outlives_the_settle(
    two_instances: tuple[SharedCancelRegistry, ...], redis_server: RedisServer, admitter: Admitter
) -> None:
    """Cancelled where it runs, the request's store record learns of it only from its settle:
    another instance, asked again (a client retrying its cancel), answers as the first did."""
    runs, other = two_instances
    admitted = await admitter.admit(redis_server.url, "r-cancel-here")
    assert admitted.lease is not None
    live = runs.register("r-cancel-here", "alice")

    assert (await runs.cancel("r-cancel-here", "alice")).outcome is CancelOutcome.CANCELLED
    assert live.end() is True
    assert await admitted.lease.settle(cancelled=live.cancelled) is False  # none reached the store
    runs.finish(live)
    assert (await other.cancel("r-cancel-here", "alice")).outcome is CancelOutcome.CANCELLED
