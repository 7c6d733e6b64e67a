"""Cross-instance cancel: two edge "instances" (two buses, their own Redis clients) on one real Redis.

A request is live there from its limiter admit (edge/cancel/bus.py): each test admits its requests
with the real RedisLimiter on the same Redis, as the edge does before a stream starts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from edge.cancel.bus import CHANNEL, CancelBus, CancelBusUnavailable, RedisCancelBus
from edge.cancel.outcome import CancelOutcome
from edge.cancel.registry import CancelRegistry
from edge.cancel.shared import SharedCancelRegistry
from limiter.memory import DEFAULT_LEASE_TTL_S
from limiter.redis_store import record_key, user_keys
from tests.admission.flow import until
from tests.limiter.tiers import tier
from tests.support.admitted import Admitter
from tests.support.ports import free_port
from tests.support.primary_endpoint import failover_pair
from tests.support.redis_server import RedisServer, start_redis, start_redis_cluster
from tests.support.stalling_proxy import stalling_proxy


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
    two_instances: Instances, redis_server: RedisServer, admitter: Admitter
) -> None:
    a, inbox_a, b, inbox_b = two_instances
    admitted = await admitter.admit(redis_server.url, "req-1")
    assert admitted.lease is not None

    assert await b.cancel("req-1", "alice") == "cancelled"
    await inbox_a.wait_for(("req-1", "alice"))
    # Every instance hears it; the one that does not hold the stream ignores it.
    await inbox_b.wait_for(("req-1", "alice"))
    assert await a.cancel("req-1", "alice") == "cancelled"  # again: the same answer
    assert await admitted.lease.settle() is True  # its settle learns of it
    assert await a.cancel("req-1", "alice") == "cancelled"  # a cancel ended it: idempotent


@pytest.mark.anyio
async def test_another_users_or_an_unknown_id_is_not_found_and_not_published(
    two_instances: Instances, redis_server: RedisServer, admitter: Admitter
) -> None:
    _, inbox_a, b, _ = two_instances
    await admitter.admit(redis_server.url, "req-2")
    await admitter.admit(redis_server.url, "req-2m", user="mallory")
    assert await b.cancel("req-2", "mallory") == "not_found"
    assert await b.cancel("req-2m", "alice") == "not_found"
    assert await b.cancel("req-unknown", "alice") == "not_found"

    # A real cancel published after them is the first thing instance A receives.
    assert await b.cancel("req-2", "alice") == "cancelled"
    await inbox_a.wait_for(("req-2", "alice"))
    assert inbox_a.received == [("req-2", "alice")]


@pytest.mark.anyio
async def test_an_ended_or_settled_request_answers_finished_to_its_owner_only(
    two_instances: Instances, redis_server: RedisServer, admitter: Admitter
) -> None:
    _, inbox_a, b, _ = two_instances
    # Settled (its stream ended, or its client left): the settle answers that no cancel came first.
    admitted = await admitter.admit(redis_server.url, "req-3")
    assert admitted.lease is not None
    assert await admitted.lease.settle() is False
    assert await b.cancel("req-3", "alice") == "finished"
    assert await b.cancel("req-3", "mallory") == "not_found"
    # Turned away after its admit (never ran, refunded whole): over all the same.
    refunded = await admitter.admit(redis_server.url, "req-3b")
    assert refunded.lease is not None
    assert await refunded.lease.settle(ran=False) is False
    assert await b.cancel("req-3b", "alice") == "finished"
    assert inbox_a.received == []


@pytest.mark.anyio
async def test_a_request_the_limiter_turned_away_is_not_found(
    two_instances: Instances, redis_server: RedisServer, admitter: Admitter
) -> None:
    _, inbox_a, b, _ = two_instances
    refused = await admitter.admission(redis_server.url, "req-8", "alice", tier(tokens=5))
    assert not refused.decision.allowed
    assert await b.cancel("req-8", "alice") == "not_found"
    assert inbox_a.received == []


@pytest.mark.anyio
async def test_the_slot_of_an_instance_that_died_is_not_found_once_its_lease_is_over(
    two_instances: Instances, redis_server: RedisServer, admitter: Admitter
) -> None:
    """An instance killed mid-stream never settles: its slot stays in the user's set, scored by
    when its lease ends, until the user's next admit drops it. Its lease over, nobody runs it."""
    _, inbox_a, b, _ = two_instances
    await admitter.admit(redis_server.url, "req-9")
    _, _, slots = user_keys("alice")
    raw = Redis.from_url(redis_server.url)
    try:
        assert await raw.zadd(slots, {"req-9": 1}, xx=True, ch=True) == 1  # the lease ran out long ago
    finally:
        await raw.aclose()
    assert await b.cancel("req-9", "alice") == "not_found"
    assert inbox_a.received == []


@pytest.mark.anyio
async def test_records_expire_and_share_their_users_slot(
    redis_server: RedisServer, admitter: Admitter
) -> None:
    bus = RedisCancelBus.from_url(redis_server.url, ttl_s=7200)
    raw = Redis.from_url(redis_server.url)
    try:
        admitted = await admitter.admit(redis_server.url, "req-4")
        assert admitted.lease is not None
        assert await bus.cancel("req-4", "alice") == "cancelled"
        assert 3600 < await raw.ttl(record_key("alice", "req-4")) <= 7200
        assert await admitted.lease.settle() is True
        # Settled: "finished" for as long as the slot could have lived, then "not_found".
        assert 0 < await raw.ttl(record_key("alice", "req-4")) <= DEFAULT_LEASE_TTL_S + 1
        # The hash tag of the limiter's keys for that user (limiter/redis_store.py): one slot.
        assert record_key("alice", "req-4").startswith("fg:{alice}:")
    finally:
        await bus.aclose()
        await raw.aclose()


@pytest.mark.anyio
async def test_the_subscription_comes_back_after_redis_restarts(admitter: Admitter) -> None:
    server = start_redis()
    bus = RedisCancelBus.from_url(server.url, reconnect_delay_s=0.05)
    inbox = Inbox()
    await bus.start(inbox)
    assert await bus.wait_subscribed(5)
    try:
        server.kill()
        server = start_redis(server.port)
        await admitter.admit(server.url, "req-5")
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
async def test_start_does_not_wait_for_an_unreachable_redis_and_subscribes_once_it_is_up(
    admitter: Admitter,
) -> None:
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
        await admitter.admit(server.url, "req-7")
        assert await bus.cancel("req-7", "alice") == "cancelled"
        await inbox.wait_for(("req-7", "alice"))
    finally:
        await bus.aclose()
        server.stop()


@pytest.mark.anyio
async def test_cancel_across_instances_on_a_redis_cluster(admitter: Admitter) -> None:
    cluster = start_redis_cluster(3)
    # Each instance subscribes through a different node: pub/sub is broadcast across the cluster.
    url = f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"
    a = RedisCancelBus.from_url(url)
    b = RedisCancelBus.from_url(f"redis+cluster://127.0.0.1:{cluster.nodes[2].port}")
    inbox_a = Inbox()
    await a.start(inbox_a)
    await b.start(Inbox())
    assert await a.wait_subscribed(5) and await b.wait_subscribed(5)
    try:
        for i in range(5):  # users land in different slots, on different nodes
            user = f"user-{i}"
            admitted = await admitter.admit(url, f"req-c{i}", user)
            assert admitted.lease is not None
            assert await b.cancel(f"req-c{i}", "mallory") == "not_found"
            assert await b.cancel(f"req-c{i}", user) == "cancelled"
            await inbox_a.wait_for((f"req-c{i}", user))
            assert await admitted.lease.settle() is True
            assert await b.cancel(f"req-c{i}", user) == "cancelled"  # a cancel ended it: idempotent
    finally:
        await a.aclose()
        await b.aclose()
        cluster.stop()


@pytest.mark.anyio
async def test_an_unreachable_cluster_answers_unavailable() -> None:
    # The cluster client fails with RedisClusterException (no RedisError) when no node answers:
    # a cancel must answer "unavailable" (503), not crash.
    bus = RedisCancelBus.from_url(f"redis+cluster://127.0.0.1:{free_port()}")
    await bus.start(Inbox())
    try:
        with pytest.raises(CancelBusUnavailable):
            await bus.cancel("req-u1", "alice")
    finally:
        await bus.aclose()


@pytest.mark.anyio
async def test_shared_registries_cancel_a_stream_held_by_another_instance(
    redis_server: RedisServer, admitter: Admitter
) -> None:
    here, there = CancelRegistry(), CancelRegistry()
    bus_a = RedisCancelBus.from_url(redis_server.url)
    a = SharedCancelRegistry(here, bus_a)
    b = SharedCancelRegistry(there, RedisCancelBus.from_url(redis_server.url))
    await a.start()
    await b.start()
    assert await bus_a.wait_subscribed(5)
    try:
        await admitter.admit(redis_server.url, "req-s1")
        ended_lease = (await admitter.admit(redis_server.url, "req-s2")).lease
        assert ended_lease is not None
        live = a.register("req-s1", "alice")
        ended = a.register("req-s2", "alice")
        assert ended.end() is False
        assert await ended_lease.settle() is False
        a.finish(ended)

        assert (await b.cancel("req-s1", "mallory")).outcome is CancelOutcome.NOT_FOUND
        assert (await b.cancel("req-s2", "alice")).outcome is CancelOutcome.FINISHED
        assert (await b.cancel("req-s1", "alice")).outcome is CancelOutcome.CANCELLED
        await until(lambda: live.cancelled)  # instance A stopped its stream
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.anyio
async def test_a_cancel_published_while_an_instance_was_not_subscribed_reaches_it_once_it_is(
    redis_server: RedisServer, admitter: Admitter
) -> None:
    """Pub/sub drops what is published to nobody: a subscription read the store's marks of its
    requests when it comes (back) up."""
    here, there = CancelRegistry(), CancelRegistry()
    bus_a = RedisCancelBus.from_url(redis_server.url)
    a = SharedCancelRegistry(here, bus_a)
    b = SharedCancelRegistry(there, RedisCancelBus.from_url(redis_server.url))
    await b.start()
    try:
        await admitter.admit(redis_server.url, "req-m1")
        await admitter.admit(redis_server.url, "req-m2")
        missed = a.register("req-m1", "alice")
        running = a.register("req-m2", "alice")
        assert (await b.cancel("req-m1", "alice")).outcome is CancelOutcome.CANCELLED  # A hears nothing
        await a.start()
        await until(lambda: missed.cancelled)
        assert not running.cancelled
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.anyio
async def test_a_subscription_link_gone_silent_is_subscribed_again_and_its_missed_cancels_applied(
    redis_server: RedisServer, admitter: Admitter
) -> None:
    """A's subscription goes through a path that goes silent without a reset (a NAT or load balancer
    dropping it): its idle pings go unanswered, it subscribes again and finds the cancel it missed."""
    with stalling_proxy(redis_server.port) as proxy:
        here = CancelRegistry()
        bus_a = RedisCancelBus(
            Redis.from_url(redis_server.url, socket_timeout=1),
            Redis.from_url(f"redis://127.0.0.1:{proxy.port}/0"),
            idle_ping_s=0.2,
            pong_timeout_s=0.5,
        )
        a = SharedCancelRegistry(here, bus_a)
        b = SharedCancelRegistry(CancelRegistry(), RedisCancelBus.from_url(redis_server.url))
        await a.start()
        await b.start()
        assert await bus_a.wait_subscribed(5)
        try:
            await admitter.admit(redis_server.url, "req-q1")
            live = a.register("req-q1", "alice")
            proxy.stall()
            assert (await b.cancel("req-q1", "alice")).outcome is CancelOutcome.CANCELLED  # lost on A's link
            await until(lambda: live.cancelled, timeout_s=10, poll_s=0.05)
        finally:
            await a.aclose()
            await b.aclose()


@pytest.mark.anyio
async def test_a_cancel_after_a_failover_behind_the_primary_endpoint_reaches_the_new_primary(
    admitter: Admitter,
) -> None:
    """A standalone Redis failed over behind its endpoint's name (ElastiCache without cluster mode):
    the bus's connection stays with the old primary, now a replica answering READONLY; the cancel
    must go to the new primary, not fail until the edge restarts."""
    with failover_pair() as (old, new, endpoint):
        bus = RedisCancelBus.from_url(endpoint.url)
        inbox = Inbox()
        await bus.start(inbox)
        try:
            assert await bus.wait_subscribed(5)
            assert await bus.cancel("req-before", "alice") == "not_found"  # its connection, to `old`
            admitted = await admitter.admit(new.url, "req-after")
            assert admitted.lease is not None
            endpoint.point_at(new.port)
            old.command("REPLICAOF", "127.0.0.1", str(new.port))
            # Synced: the old primary reads the request as running, and refuses the mark.
            slots = user_keys("alice")[2]
            await until(lambda: old.command("EXISTS", slots) == b":1\r\n", poll_s=0.01)
            assert await bus.cancel("req-after", "alice") == "cancelled"
            assert new.command("GET", record_key("alice", "req-after")) == b"$9\r\ncancelled\r\n"
        finally:
            await bus.aclose()


@pytest.mark.anyio
async def test_a_cancel_sent_again_after_a_failover_reaches_the_edges_on_the_new_primary(
    admitter: Admitter,
) -> None:
    """A's connection stays with the old primary, demoted: a cancel sent again (its first answer
    lost) finds the record marked there, so nothing refuses it READONLY, and its PUBLISH, which a
    replica takes, reached only that server's subscribers, not B, subscribed to the new primary."""
    with failover_pair() as (old, new, endpoint):
        a, b = RedisCancelBus.from_url(endpoint.url), RedisCancelBus.from_url(endpoint.url)
        inbox_b = Inbox()
        await a.start(Inbox())
        try:
            assert await a.cancel("req-before", "alice") == "not_found"  # its connection, to `old`
            admitted = await admitter.admit(new.url, "req-again")
            assert admitted.lease is not None
            endpoint.point_at(new.port)
            old.command("REPLICAOF", "127.0.0.1", str(new.port))
            await b.start(inbox_b)
            assert await b.wait_subscribed(5)
            assert await b.cancel("req-again", "alice") == "cancelled"
            await inbox_b.wait_for(("req-again", "alice"))
            mark = record_key("alice", "req-again")
            await until(lambda: old.command("GET", mark) == b"$9\r\ncancelled\r\n", poll_s=0.01)

            assert await a.cancel("req-again", "alice") == "cancelled"
            await until(lambda: inbox_b.received.count(("req-again", "alice")) == 2, timeout_s=5)
        finally:
            await a.aclose()
            await b.aclose()


@pytest.mark.anyio
async def test_a_cancel_published_on_the_new_primary_reaches_an_edge_subscribed_to_the_old_one(
    admitter: Admitter,
) -> None:
    """A's subscription stays with the old primary, which answers its pings: a cancel published on
    the new primary before the old one replicates from it (here: demoted, never caught up) never
    reached A, and nothing made A look it up. A must subscribe again, to the new primary, and find
    the mark there, not on its connections to the old one, which has none."""
    with failover_pair() as (old, new, endpoint):
        a, b = RedisCancelBus.from_url(endpoint.url), RedisCancelBus.from_url(endpoint.url)
        inbox_a = Inbox()
        await a.start(inbox_a, lambda: [("req-moved", "alice")])
        try:
            assert await a.wait_subscribed(5)
            assert await a.cancel("req-before", "alice") == "not_found"  # its connection, to `old`
            admitted = await admitter.admit(new.url, "req-moved")
            assert admitted.lease is not None
            # Demoted (behind for good) as the endpoint moves, as a failover does. Demoted after it,
            # A's check could move A to `new` while `old` still took writes: its look-up of the
            # cancels missed read `old` on a pooled connection, found none, and was not made again
            # (seen once in three runs of the suite in four processes).
            old.command("REPLICAOF", "127.0.0.1", str(free_port()))
            endpoint.point_at(new.port)
            assert await b.cancel("req-moved", "alice") == "cancelled"  # on `new`

            await until(lambda: ("req-moved", "alice") in inbox_a.received, timeout_s=30, poll_s=0.05)
        finally:
            await a.aclose()
            await b.aclose()


@pytest.mark.anyio
async def test_a_cancel_marked_on_the_new_primary_while_the_old_one_is_still_primary_reaches_the_edge(
    admitter: Admitter,
) -> None:
    """A failover's window: the endpoint leads to the new primary while the old one, not yet
    demoted, still takes writes. A's subscription comes back through the endpoint, to the new
    primary, but its look-up of the cancels missed went on a pooled connection still on the old
    one, which refused nothing (it is a primary), had no mark, and was not made again: the cancel
    marked on the new primary meanwhile was lost and the stream ran on. The look-up must read the
    server the subscription is on."""
    with failover_pair() as (old, new, endpoint):
        a, b = RedisCancelBus.from_url(endpoint.url), RedisCancelBus.from_url(endpoint.url)
        inbox_a = Inbox()
        await a.start(inbox_a, lambda: [("req-window", "alice")])
        try:
            assert await a.wait_subscribed(5)
            assert await a.cancel("req-before", "alice") == "not_found"  # its connection, to `old`
            admitted = await admitter.admit(new.url, "req-window")
            assert admitted.lease is not None
            endpoint.point_at(new.port)  # `old` stays a primary: no REPLICAOF yet
            assert await b.cancel("req-window", "alice") == "cancelled"  # on `new`; A is on `old`
            assert ("req-window", "alice") not in inbox_a.received
            with capture_logs() as logs:
                # A's subscription link breaks (as a failover's often do) and comes back through
                # the endpoint, to `new`; its pooled connection for the look-up stays on `old`.
                old.command("CLIENT", "KILL", "TYPE", "pubsub")

                await until(lambda: ("req-window", "alice") in inbox_a.received, timeout_s=10, poll_s=0.05)
            assert new.command("PUBSUB", "NUMSUB", CHANNEL).endswith(b":1\r\n")  # A, there
            assert "cancel_bus_reconcile_off_subscription_server" not in [line["event"] for line in logs]
        finally:
            await a.aclose()
            await b.aclose()


@pytest.mark.anyio
async def test_a_look_up_that_cannot_reach_the_subscriptions_server_stops_after_a_few_tries(
    admitter: Admitter,
) -> None:
    """The look-up's connections lead to another server than the subscription's (the endpoint
    moved, the subscription not yet): it reads there again a few times, never in a hot loop, then
    leaves it to the subscription's move, delivering meanwhile the marks it read there."""
    with failover_pair() as (old, new, _):
        a = RedisCancelBus(Redis.from_url(new.url), Redis.from_url(old.url))
        b = RedisCancelBus.from_url(new.url)
        inbox_a = Inbox()
        try:
            admitted = await admitter.admit(new.url, "req-elsewhere")
            assert admitted.lease is not None
            assert await b.cancel("req-elsewhere", "alice") == "cancelled"  # on `new`
            new.command("CONFIG", "RESETSTAT")
            with capture_logs() as logs:
                await a.start(inbox_a, lambda: [("req-elsewhere", "alice")])
                await inbox_a.wait_for(("req-elsewhere", "alice"))
                off = "cancel_bus_reconcile_off_subscription_server"
                await until(lambda: off in [line["event"] for line in logs], timeout_s=10, poll_s=0.05)
            assert b"cmdstat_eval:calls=5," in new.command("INFO", "commandstats")
        finally:
            await a.aclose()
            await b.aclose()


@pytest.mark.anyio
async def test_a_cancel_on_a_connection_left_on_a_demoted_primary_behind_the_new_one_is_not_lost(
    admitter: Admitter,
) -> None:
    """The bus's connection stays with the old primary, demoted and not yet caught up (a full
    resync, a link down): it has no lease for a request admitted on the new primary, and the cancel
    script answered not_found from there without a write for it to refuse: a 404 for a live
    request, whose stream ran on, and every such cancel for as long as the connection stayed. The
    cancel must be decided on the new primary."""
    with failover_pair() as (old, new, endpoint):
        bus = RedisCancelBus.from_url(endpoint.url)
        try:
            assert await bus.cancel("req-before", "alice") == "not_found"  # its connection, to `old`
            endpoint.point_at(new.port)
            old.command("REPLICAOF", "127.0.0.1", str(free_port()))  # demoted, behind for good
            admitted = await admitter.admit(new.url, "req-behind")
            assert admitted.lease is not None

            assert await bus.cancel("req-behind", "alice") == "cancelled"
            assert new.command("GET", record_key("alice", "req-behind")) == b"$9\r\ncancelled\r\n"
        finally:
            await bus.aclose()


# The limiter's keys, the fleet's, the channels: no more (resetchannels: Redis 6 allows them all).
LEAST_PRIVILEGE_ACL = "on >secret ~fg:* ~{floodgate:* resetchannels &floodgate:* +@all"


@pytest.mark.anyio
async def test_a_cancel_by_a_user_refused_the_publish_check_still_reaches_the_other_edges(
    admitter: Admitter,
) -> None:
    """A least-privilege ACL (the limiter's keys `fg:*`, the fleet's `{floodgate:*`, the channels)
    refuses the publish script's no-op write on `floodgate:publish-on-primary`: every cancel was
    marked, then answered 503, and never reached the edge running the stream. It must go out as a
    plain PUBLISH, as before the check, and say so."""
    server = start_redis()
    try:
        server.command("ACL", "SETUSER", "edge", *LEAST_PRIVILEGE_ACL.split())
        url = f"redis://edge:secret@127.0.0.1:{server.port}/0"
        a, b = RedisCancelBus.from_url(url), RedisCancelBus.from_url(url)
        inbox_a = Inbox()
        with capture_logs() as logs:
            await a.start(inbox_a)
            try:
                assert await a.wait_subscribed(5)
                admitted = await admitter.admit(server.url, "req-acl")
                assert admitted.lease is not None
                assert await b.cancel("req-acl", "alice") == "cancelled"
                await inbox_a.wait_for(("req-acl", "alice"))
            finally:
                await a.aclose()
                await b.aclose()
        assert "primary_publish_refused" in [line["event"] for line in logs]
    finally:
        server.kill()


@pytest.mark.anyio
async def test_the_missed_cancels_of_a_user_refused_the_look_up_check_are_still_delivered(
    admitter: Admitter,
) -> None:
    """The same ACL refuses the no-op write the look-up of missed cancels begins with: the look-up
    failed at every subscription, so a cancel published while an edge was away never stopped its
    stream. It must read the marks unchecked, as before the check, and say so."""
    server = start_redis()
    try:
        server.command("ACL", "SETUSER", "edge", *LEAST_PRIVILEGE_ACL.split())
        url = f"redis://edge:secret@127.0.0.1:{server.port}/0"
        a, b = RedisCancelBus.from_url(url), RedisCancelBus.from_url(url)
        inbox_a = Inbox()
        try:
            admitted = await admitter.admit(server.url, "req-missed")
            assert admitted.lease is not None
            assert await b.cancel("req-missed", "alice") == "cancelled"  # A is not subscribed yet
            with capture_logs() as logs:
                await a.start(inbox_a, lambda: [("req-missed", "alice")])
                await inbox_a.wait_for(("req-missed", "alice"))
            assert "cancel_bus_reconcile_check_refused" in [line["event"] for line in logs]
        finally:
            await a.aclose()
            await b.aclose()
    finally:
        server.kill()
