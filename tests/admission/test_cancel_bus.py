"""Cross-instance cancel: two edge "instances" (two buses, their own Redis clients) on one real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from redis.asyncio import Redis

from edge.cancel.bus import CancelBus, CancelBusUnavailable, RedisCancelBus, owner_key
from edge.cancel.outcome import CancelOutcome
from edge.cancel.registry import CancelRegistry
from edge.cancel.shared import SharedCancelRegistry
from tests.admission.flow import until
from tests.support.in_memory_cancel_bus import InMemoryCancelBus
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer, start_redis, start_redis_cluster


class Inbox:
    """What one instance's registry would be handed: (request_id, user) per delivered cancel."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    def __call__(self, request_id: str, user: str) -> None:
        self.received.append((request_id, user))
        self._changed.set()

    async def wait_for(self, item: tuple[str, str]) -> None:
        with anyio.fail_after(5):
            while item not in self.received:
                self._changed.clear()
                await self._changed.wait()


Instances = tuple[CancelBus, "Inbox", CancelBus, "Inbox"]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
async def two_instances(redis_server: RedisServer) -> AsyncIterator[Instances]:
    a, b = RedisCancelBus.from_url(redis_server.url), RedisCancelBus.from_url(redis_server.url)
    inbox_a, inbox_b = Inbox(), Inbox()
    await a.start(inbox_a)
    await b.start(inbox_b)
    assert await a.wait_subscribed(5) and await b.wait_subscribed(5)
    yield a, inbox_a, b, inbox_b
    await a.aclose()
    await b.aclose()


@pytest.mark.anyio
async def test_a_cancel_on_another_instance_reaches_the_one_running_the_request(
    two_instances: Instances,
) -> None:
    a, inbox_a, b, inbox_b = two_instances
    await a.track("req-1", "alice")

    assert await b.cancel("req-1", "alice") == "cancelled"
    await inbox_a.wait_for(("req-1", "alice"))
    # Every instance hears it; the one that does not hold the stream ignores it.
    await inbox_b.wait_for(("req-1", "alice"))


@pytest.mark.anyio
async def test_another_users_or_an_unknown_id_is_not_found_and_not_published(
    two_instances: Instances,
) -> None:
    a, inbox_a, b, _ = two_instances
    await a.track("req-2", "alice")
    assert await b.cancel("req-2", "mallory") == "not_found"
    assert await b.cancel("req-unknown", "alice") == "not_found"

    # A real cancel published after them is the first thing instance A receives.
    assert await b.cancel("req-2", "alice") == "cancelled"
    await inbox_a.wait_for(("req-2", "alice"))
    assert inbox_a.received == [("req-2", "alice")]


@pytest.mark.anyio
async def test_a_finished_request_answers_finished_to_its_owner_only(
    two_instances: Instances,
) -> None:
    a, _, b, _ = two_instances
    await a.track("req-3", "alice")
    await a.finish("req-3", "alice")
    assert await b.cancel("req-3", "alice") == "finished"
    assert await b.cancel("req-3", "mallory") == "not_found"


@pytest.mark.anyio
async def test_owner_records_expire_and_share_a_slot_per_request(redis_server: RedisServer) -> None:
    bus = RedisCancelBus.from_url(redis_server.url, ttl_s=120, finished_ttl_s=30)
    raw = Redis.from_url(redis_server.url)
    try:
        await bus.track("req-4", "alice")
        assert 0 < await raw.ttl(owner_key("req-4")) <= 120
        await bus.finish("req-4", "alice")
        assert 0 < await raw.ttl(owner_key("req-4")) <= 30
        assert owner_key("req-4").endswith("{req-4}")
    finally:
        await bus.aclose()
        await raw.aclose()


@pytest.mark.anyio
async def test_the_subscription_comes_back_after_redis_restarts() -> None:
    server = start_redis()
    bus = RedisCancelBus.from_url(server.url, reconnect_delay_s=0.05)
    inbox = Inbox()
    await bus.start(inbox)
    assert await bus.wait_subscribed(5)
    try:
        server.kill()
        server = start_redis(server.port)
        await bus.track("req-5", "alice")
        # The listener resubscribes on its own; cancel until one lands (bounded by wait_for).
        with anyio.fail_after(10):
            while ("req-5", "alice") not in inbox.received:
                assert await bus.cancel("req-5", "alice") == "cancelled"
                with anyio.move_on_after(0.2):
                    await inbox.wait_for(("req-5", "alice"))
    finally:
        await bus.aclose()
        server.stop()


@pytest.mark.anyio
async def test_start_does_not_wait_for_an_unreachable_redis_and_subscribes_once_it_is_up() -> None:
    server = start_redis()
    port = server.port
    server.kill()  # nothing listens on the port now
    bus = RedisCancelBus.from_url(f"redis://127.0.0.1:{port}/0", reconnect_delay_s=0.05)
    inbox = Inbox()
    await bus.start(inbox)
    try:
        assert not await bus.wait_subscribed(0)
        server = start_redis(port)
        assert await bus.wait_subscribed(10)  # the background retries found it
        await bus.track("req-7", "alice")
        assert await bus.cancel("req-7", "alice") == "cancelled"
        await inbox.wait_for(("req-7", "alice"))
    finally:
        await bus.aclose()
        server.stop()


@pytest.mark.anyio
async def test_in_memory_bus_answers_like_redis() -> None:
    bus = InMemoryCancelBus()
    inbox = Inbox()
    await bus.start(inbox)
    await bus.track("req-6", "alice")
    assert await bus.cancel("req-6", "mallory") == "not_found"
    assert await bus.cancel("req-unknown", "alice") == "not_found"
    assert await bus.cancel("req-6", "alice") == "cancelled"
    assert inbox.received == [("req-6", "alice")]
    await bus.finish("req-6", "alice")
    assert await bus.cancel("req-6", "alice") == "finished"
    assert await bus.cancel("req-6", "mallory") == "not_found"
    await bus.aclose()


@pytest.mark.anyio
async def test_cancel_across_instances_on_a_redis_cluster() -> None:
    cluster = start_redis_cluster(3)
    # Each instance subscribes through a different node: pub/sub is broadcast across the cluster.
    a = RedisCancelBus.from_url(f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}")
    b = RedisCancelBus.from_url(f"redis+cluster://127.0.0.1:{cluster.nodes[2].port}")
    inbox_a = Inbox()
    await a.start(inbox_a)
    await b.start(Inbox())
    assert await a.wait_subscribed(5) and await b.wait_subscribed(5)
    try:
        for i in range(5):  # ids land in different slots, on different nodes
            await a.track(f"req-c{i}", "alice")
            assert await b.cancel(f"req-c{i}", "mallory") == "not_found"
            assert await b.cancel(f"req-c{i}", "alice") == "cancelled"
            await inbox_a.wait_for((f"req-c{i}", "alice"))
    finally:
        await a.aclose()
        await b.aclose()
        cluster.stop()


@pytest.mark.anyio
async def test_an_unreachable_cluster_loses_the_record_and_answers_unavailable() -> None:
    # The cluster client fails with RedisClusterException (no RedisError) when no node answers:
    # a request must still go on, and a cancel must answer "unavailable" (503), not crash.
    bus = RedisCancelBus.from_url(f"redis+cluster://127.0.0.1:{free_port()}")
    await bus.start(Inbox())
    try:
        await bus.track("req-u1", "alice")
        await bus.finish("req-u1", "alice")
        with pytest.raises(CancelBusUnavailable):
            await bus.cancel("req-u1", "alice")
    finally:
        await bus.aclose()


@pytest.mark.anyio
async def test_shared_registries_cancel_a_stream_held_by_another_instance(redis_server: RedisServer) -> None:
    here, there = CancelRegistry(), CancelRegistry()
    bus_a = RedisCancelBus.from_url(redis_server.url)
    a = SharedCancelRegistry(here, bus_a)
    b = SharedCancelRegistry(there, RedisCancelBus.from_url(redis_server.url))
    await a.start()
    await b.start()
    assert await bus_a.wait_subscribed(5)
    try:
        live = a.register("req-s1", "alice")
        other = a.register("req-s2", "alice")
        a.finish(other)
        await a.drain()

        assert await b.cancel("req-s1", "mallory") is CancelOutcome.NOT_FOUND
        assert await b.cancel("req-s2", "alice") is CancelOutcome.FINISHED
        assert await b.cancel("req-s1", "alice") is CancelOutcome.CANCELLED
        await until(lambda: live.cancelled)  # instance A stopped its stream
    finally:
        await a.aclose()
        await b.aclose()
