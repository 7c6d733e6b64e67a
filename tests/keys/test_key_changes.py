"""Key changes over Redis pub/sub (edge/keys/changes.py): a standalone Redis failed over behind its
primary endpoint (ElastiCache without cluster mode, Sentinel: the old primary is demoted to a replica
of the new one, the endpoint's name leads to the new one), and a Cluster reached through any node."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from edge.keys.changes import CHANNEL, RedisKeyChanges
from tests.admission.flow import until
from tests.support.primary_endpoint import failover_pair
from tests.support.redis_server import start_redis, start_redis_cluster

pytestmark = pytest.mark.anyio


async def test_a_change_announced_after_a_failover_reaches_the_edges_on_the_new_primary() -> None:
    """The announcing edge's connection stays with the old primary: a PUBLISH, which a replica
    takes without a READONLY, reached only that server's subscribers, and an edge subscribed to the
    new primary served the revoked key until its cache TTL."""
    with failover_pair() as (old, new, endpoint):
        a, b = RedisKeyChanges(endpoint.url), RedisKeyChanges(endpoint.url)
        heard_by_b: list[str | None] = []
        try:
            assert await a.announce("before")  # its connection, to `old`
            endpoint.point_at(new.port)
            old.command("REPLICAOF", "127.0.0.1", str(new.port))
            b.start(heard_by_b.append)
            await until(b.subscribed.is_set, timeout_s=5)

            assert await a.announce("revoked")
            await until(lambda: "revoked" in heard_by_b, timeout_s=5)
        finally:
            await a.aclose()
            await b.aclose()


async def test_an_edge_subscribed_to_the_old_primary_moves_to_the_new_one_and_forgets_its_keys() -> None:
    """A's subscription stays with the old primary, which answers its pings: a key revoked on the
    new primary before the old one became its replica was never heard there, and nothing made A
    forget its cached lookup. A must subscribe again, to the new primary, and forget every key."""
    with failover_pair() as (old, new, endpoint):
        a, b = RedisKeyChanges(endpoint.url), RedisKeyChanges(endpoint.url)
        heard_by_a: list[str | None] = []
        a.start(heard_by_a.append)
        try:
            await until(a.subscribed.is_set, timeout_s=5)
            assert heard_by_a == [None]  # subscribed: it forgot every key
            endpoint.point_at(new.port)
            assert await b.announce("revoked-meanwhile")  # on `new`, not replicated to `old`
            old.command("REPLICAOF", "127.0.0.1", str(new.port))

            await until(lambda: heard_by_a.count(None) == 2, timeout_s=30, poll_s=0.05)
            assert "revoked-meanwhile" not in heard_by_a
            assert new.command("PUBSUB", "NUMSUB", CHANNEL).endswith(b":1\r\n")  # A, there
        finally:
            await a.aclose()
            await b.aclose()


async def test_a_user_refused_the_primary_check_still_hears_key_changes() -> None:
    """An ACL without @dangerous (INFO, which the check's script calls), as ElastiCache RBAC users
    often have: the subscription was dropped at the refusal and tried again for ever, so no edge
    heard a key change. It must subscribe unchecked, as before there was a check, and say so."""
    server = start_redis()
    try:
        server.command("ACL", "SETUSER", "edge", "on", ">secret", "~*", "&*", "+@all", "-@dangerous")
        url = f"redis://edge:secret@127.0.0.1:{server.port}/0"
        a, b = RedisKeyChanges(url), RedisKeyChanges(url)
        heard_by_a: list[str | None] = []
        with capture_logs() as logs:
            a.start(heard_by_a.append)
            try:
                await until(a.subscribed.is_set, timeout_s=5)
                assert await b.announce("revoked")
                await until(lambda: "revoked" in heard_by_a, timeout_s=5)
            finally:
                await a.aclose()
                await b.aclose()
        events = [line["event"] for line in logs]
        assert "key_changes_primary_check_refused" in events
        assert "key_changes_subscription_lost" not in events
    finally:
        server.kill()


async def test_a_change_announced_through_any_node_of_a_cluster_reaches_every_edge() -> None:
    """The `redis_cluster` flag with a `redis://` URL: the seed node may be a replica, or not own the
    slot of any key the announcement might touch; a plain PUBLISH on it is broadcast to every node."""
    cluster = start_redis_cluster(6, replicas=1)
    try:
        listener = RedisKeyChanges(cluster.nodes[0].url, cluster=True)
        heard: list[str | None] = []
        listener.start(heard.append)
        try:
            await until(listener.subscribed.is_set, timeout_s=5)
            for number, node in enumerate(cluster.nodes):
                # Not the edges' 250 ms: what is tested is where a PUBLISH reaches, and six nodes
                # syncing beside a loaded test run once took longer to answer (CI: False).
                announcer = RedisKeyChanges(node.url, cluster=True, timeout_ms=10_000)
                try:
                    assert await announcer.announce(f"via-{number}")
                finally:
                    await announcer.aclose()
            await until(lambda: all(f"via-{n}" in heard for n in range(len(cluster.nodes))), timeout_s=5)
        finally:
            await listener.aclose()
    finally:
        cluster.stop()
