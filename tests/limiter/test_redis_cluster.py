"""The same scripts on a 3-node Redis Cluster the test starts, plain and TLS-only (production's
ElastiCache has both cluster mode and TLS required): every user's keys share one slot, users
spread over the nodes, admits go on the limiter's own connection to the node holding the slot
(limiter/direct_calls.py), and the counts hold under concurrency, across a slot's move to another
node and across a node's loss."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import RedisCluster

from limiter.base import StoreUnavailable
from limiter.factory import create_limiter
from limiter.lease import Lease
from limiter.redis_store import RedisLimiter, record_key, user_keys
from limiter.resp_connection import CLIENT_NAME
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisClusterServers, RedisServer, start_redis_cluster
from tests.support.tls_files import TlsFiles

pytestmark = pytest.mark.anyio
USERS = 8
ATTEMPTS = 40
LIMIT = 5
SETTLE_S = 30.0


@pytest.fixture(scope="module", params=["plain", "tls"])
def cluster(request: pytest.FixtureRequest, tls_files: TlsFiles) -> Iterator[RedisClusterServers]:
    servers = start_redis_cluster(3, tls=tls_files if request.param == "tls" else None)
    yield servers
    servers.stop()


@pytest.fixture
async def probe(cluster: RedisClusterServers) -> AsyncIterator[RedisCluster]:
    client = RedisCluster.from_url(cluster.url)
    yield client
    await client.aclose()


def _node_holding(cluster: RedisClusterServers, probe: RedisCluster, user: str) -> RedisServer:
    node = probe.get_node_from_key(user_keys(user)[0])
    assert node is not None
    return next(server for server in cluster.nodes if server.port == int(node.port))


def _admits_on_own_connection(node: RedisServer) -> bool:
    """The node has the limiter's admit connection, and its last command was the admit script."""
    return any(c["name"] == CLIENT_NAME and c["cmd"] == "evalsha" for c in node.clients())


async def test_cluster_runs_the_scripts_and_the_counts_hold(
    cluster: RedisClusterServers, probe: RedisCluster
) -> None:
    # The scheme names the Cluster here (redis+cluster://, rediss+cluster://), through the factory
    # the edge uses; elsewhere the config's flag does.
    scheme, rest = cluster.url.split("://", 1)
    limiter = create_limiter("redis", f"{scheme}+cluster://{rest}", 5000, 1)
    assert isinstance(limiter, RedisLimiter)
    await probe.initialize()
    users = [f"c-{uuid.uuid4().hex}" for _ in range(USERS)]
    limits = tier(requests=LIMIT, request_window_s=3600, tokens=10**6, token_window_s=86400)
    try:
        admissions = await asyncio.gather(
            *(limiter.admit(user, f"{user}-{i}", limits, 10, 100) for i in range(ATTEMPTS) for user in users)
        )
        assert not limiter.fallback_active
        for user in users:
            mine = [a for a in admissions if a.lease is not None and a.lease._user == user]
            assert len(mine) == LIMIT

        # One slot per user (scripts may touch only keys of one slot), users on several nodes, each
        # node's admits on the limiter's own connection to it.
        slots = {user: {await probe.cluster_keyslot(key) for key in user_keys(user)} for user in users}
        assert all(len(user_slots) == 1 for user_slots in slots.values())
        holders = {
            _node_holding(cluster, probe, user).port: _node_holding(cluster, probe, user) for user in users
        }
        assert len(holders) > 1
        assert all(_admits_on_own_connection(node) for node in holders.values())

        lease = next(a.lease for a in admissions if isinstance(a.lease, Lease))
        assert await lease.take(200) == 100  # charged up to max_output_tokens on its node
        await lease.settle()
        assert await probe.zcard(user_keys(lease._user)[2]) == LIMIT - 1
    finally:
        await limiter.aclose()


ODD_USERS = ["}acme", "}", "a}b", "{x}", "{", "", "é}"]


async def test_any_user_name_keeps_its_keys_in_one_slot_and_the_store_up(
    cluster: RedisClusterServers, probe: RedisCluster
) -> None:
    """A user name beginning with "}" (or empty) made an empty hash tag: Redis hashed each of its keys
    whole, every script failed CROSSSLOT, and that counted as the store failing, so one such user
    sent every user to the fallback (503 on a fail-closed tier) for a backoff at each request, and
    its settle kept failing in the queue for the slot's TTL. Now each name's keys share one slot."""
    await probe.initialize()
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=5000, cluster=True)
    limits = tier(requests=2, request_window_s=3600, on_store_failure="closed")
    run = uuid.uuid4().hex[:8]
    try:
        for name in ODD_USERS:
            user = name + run if name else ""
            first = await limiter.admit(user, f"{run}-1", limits, 10, 10)
            assert first.decision.allowed and not limiter.fallback_active, user
            assert first.lease is not None
            assert await first.lease.take(5) == 5
            await first.lease.settle()
            assert (await limiter.admit(user, f"{run}-2", limits, 10, 10)).decision.allowed
            third = await limiter.admit(user, f"{run}-3", limits, 10, 10)
            assert not third.decision.allowed and third.decision.limit == "requests", user
            assert not limiter.fallback_active
            keys = (*user_keys(user), record_key(user, "r1"))
            assert len({probe.keyslot(key) for key in keys}) == 1, (user, keys)
        # Distinct names, distinct keys, whatever their hash tags share.
        assert len({user_keys(name + run if name else "")[0] for name in ODD_USERS}) == len(ODD_USERS)
    finally:
        await limiter.aclose()


def _count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _node_id(node: RedisServer) -> str:
    return node.command("CLUSTER", "MYID").decode().split("\r\n")[1]


def _ok(reply: bytes) -> None:
    assert reply.startswith(b"+OK"), reply


async def test_a_slot_moved_to_another_node_is_followed_and_its_counts_hold(
    cluster: RedisClusterServers, probe: RedisCluster
) -> None:
    """The limiter's slot map says the user is on one node; the slot moves (keys and all, as a
    resharding does): the next admit is answered MOVED there, goes where the slot now is, and counts
    on what the first node had counted."""
    await probe.initialize()
    user = f"m-{uuid.uuid4().hex}"
    limits = tier(requests=2, request_window_s=3600)
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=5000, cluster=True)
    try:
        assert (await limiter.admit(user, "r1", limits, 10, 10)).decision.allowed
        source = _node_holding(cluster, probe, user)
        target = next(node for node in cluster.nodes if node is not source)
        slot = str(probe.keyslot(user_keys(user)[0]))
        source_id, target_id = _node_id(source), _node_id(target)
        _ok(target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id))
        _ok(source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id))
        keys = [
            k
            for k in source.command("CLUSTER", "GETKEYSINSLOT", slot, "100").decode().split("\r\n")
            if "{" in k
        ]
        assert keys  # the first admit's counts
        _ok(source.command("MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys))
        _ok(target.command("CLUSTER", "SETSLOT", slot, "NODE", target_id))
        _ok(source.command("CLUSTER", "SETSLOT", slot, "NODE", target_id))

        moved = _count("floodgate_limiter_cluster_redirects_total", reply="MOVED")
        assert (await limiter.admit(user, "r2", limits, 10, 10)).decision.allowed
        assert (
            _count("floodgate_limiter_cluster_redirects_total", reply="MOVED") == moved + 1
        )  # the ops' view
        third = await limiter.admit(user, "r3", limits, 10, 10)
        assert not third.decision.allowed and third.decision.limit == "requests"
        assert not limiter.fallback_active  # Redis answered all three
        assert _admits_on_own_connection(target)  # the third went straight to the slot's new node
    finally:
        await limiter.aclose()


async def test_calls_asked_to_the_importing_node_during_a_migration_are_answered_there(
    cluster: RedisClusterServers, probe: RedisCluster
) -> None:
    """A slot migrating, its user's keys already on the importing node: the migrating node answers
    their charges ASK, and each is answered by the importing node, after a burst of them too. Sent
    through redis-py, ASKING went on one pooled connection and the charge on another once the pool
    held two (after the burst): the importing node sent it back (MOVED), the migrating node said
    ASK again, until redis-py gave up ("TTL exhausted"), each charge a store failure."""
    await probe.initialize()
    user = f"k-{uuid.uuid4().hex}"
    limits = tier(requests=100, request_window_s=3600, tokens=10**6, token_window_s=86400)
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=5000, cluster=True, backoff_s=0)
    source = _node_holding(cluster, probe, user)
    target = next(node for node in cluster.nodes if node is not source)
    slot = str(probe.keyslot(user_keys(user)[0]))
    source_id, target_id = _node_id(source), _node_id(target)
    try:
        leases: list[Lease] = []
        for i in range(8):
            lease = (await limiter.admit(user, f"r{i}", limits, 10, 10**5)).lease
            assert isinstance(lease, Lease)
            leases.append(lease)
        _ok(target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id))
        _ok(source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id))
        keys = [
            k
            for k in source.command("CLUSTER", "GETKEYSINSLOT", slot, "100").decode().split("\r\n")
            if "{" in k
        ]
        _ok(source.command("MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys))

        asked = _count("floodgate_limiter_cluster_redirects_total", reply="ASK")
        assert await asyncio.gather(*(lease.take(300) for lease in leases)) == [300] * len(leases)
        assert not limiter.fallback_active
        for lease in leases:  # one at a time, each asked again
            assert await lease.take(600) == 600
            assert not limiter.fallback_active
        assert _count("floodgate_limiter_cluster_redirects_total", reply="ASK") == asked + 2 * len(leases)
        assert _admits_on_own_connection(target)
    finally:
        await limiter.aclose()
        _ok(target.command("CLUSTER", "SETSLOT", slot, "NODE", target_id))
        _ok(source.command("CLUSTER", "SETSLOT", slot, "NODE", target_id))


def _start_migration(
    cluster: RedisClusterServers, probe: RedisCluster, user: str
) -> tuple[RedisServer, RedisServer, str, list[str]]:
    """The slot of `user`'s keys set migrating to another node, and the first of its keys moved
    there, the rest not (a resharding under way): the migrating node, the importing one, the slot
    and the keys left behind."""
    source = _node_holding(cluster, probe, user)
    target = next(node for node in cluster.nodes if node is not source)
    slot = str(probe.keyslot(user_keys(user)[0]))
    _ok(target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source)))
    _ok(source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target)))
    keys = [
        k for k in source.command("CLUSTER", "GETKEYSINSLOT", slot, "100").decode().split("\r\n") if "{" in k
    ]
    assert len(keys) > 1
    _ok(source.command("MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", keys[0]))
    return source, target, slot, keys[1:]


def _end_migration(source: RedisServer, target: RedisServer, slot: str, left: list[str]) -> None:
    _ok(source.command("MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *left))
    _ok(target.command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(target)))
    _ok(source.command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(target)))


async def test_a_slot_mid_migration_is_answered_without_redis_for_its_users_alone(
    cluster: RedisClusterServers, probe: RedisCluster
) -> None:
    """A slot mid-migration answers its users' admits TRYAGAIN (their keys are split between the
    nodes, and an admit's request record is on neither) until its move ends: each admit is sent
    again a few times, then that admit alone is answered without Redis (the fallback for a fail-open
    tier, a 503 for a fail-closed one), and the store is not taken for down: another user's admit
    right after still goes to Redis. Through redis-py the TRYAGAINs ended in "TTL exhausted", a
    store failure: every user of the edge went to the fallback for a backoff."""
    await probe.initialize()
    user, other = f"t-{uuid.uuid4().hex}", f"u-{uuid.uuid4().hex}"
    limits = tier(requests=100, request_window_s=3600)
    closed = tier(requests=100, request_window_s=3600, on_store_failure="closed")
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=5000, cluster=True)
    assert (await limiter.admit(user, "r1", limits, 10, 10)).decision.allowed
    source, target, slot, left = _start_migration(cluster, probe, user)
    try:
        tried = _count("floodgate_limiter_cluster_redirects_total", reply="TRYAGAIN")
        busy = _count("floodgate_limiter_slot_busy_total", op="admit")

        assert (await limiter.admit(user, "r2", limits, 10, 10)).decision.allowed  # the fallback's
        assert not limiter.fallback_active
        assert _count("floodgate_limiter_cluster_redirects_total", reply="TRYAGAIN") > tried + 1
        assert _count("floodgate_limiter_slot_busy_total", op="admit") == busy + 1
        with pytest.raises(StoreUnavailable):
            await limiter.admit(user, "r3", closed, 10, 10)
        assert not limiter.fallback_active

        assert (await limiter.admit(other, "r1", limits, 10, 10)).decision.allowed
        assert await probe.exists(user_keys(other)[0]) == 1  # counted on Redis
        assert not limiter.fallback_active
    finally:
        await limiter.aclose()
        _end_migration(source, target, slot, left)


async def test_a_slot_mid_migration_through_redis_py_is_answered_without_redis_for_its_users_alone(
    cluster: RedisClusterServers, probe: RedisCluster
) -> None:
    """The same on redis-py's path (own_connections=False: as where the limiter cannot open its own
    connections, a credential provider, and as for a call re-sent after a redirect): redis-py
    retries TRYAGAIN itself 16 times and raises ClusterError("TTL exhausted"), which was taken for
    a store failure, every user of the edge on the fallback for a backoff. Now that admit alone is
    answered without Redis and another user's admit right after is counted on Redis."""
    await probe.initialize()
    user, other = f"p-{uuid.uuid4().hex}", f"q-{uuid.uuid4().hex}"
    limits = tier(requests=100, request_window_s=3600)
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=5000, cluster=True, own_connections=False)
    assert (await limiter.admit(user, "r1", limits, 10, 10)).decision.allowed
    source, target, slot, left = _start_migration(cluster, probe, user)
    try:
        busy = _count("floodgate_limiter_slot_busy_total", op="admit")
        assert (await limiter.admit(user, "r2", limits, 10, 10)).decision.allowed  # the fallback's
        assert _count("floodgate_limiter_slot_busy_total", op="admit") == busy + 1
        assert not limiter.fallback_active

        assert (await limiter.admit(other, "r1", limits, 10, 10)).decision.allowed
        assert await probe.exists(user_keys(other)[0]) == 1  # counted on Redis
        assert not limiter.fallback_active
    finally:
        await limiter.aclose()
        _end_migration(source, target, slot, left)


async def test_a_migration_that_ends_while_an_admit_waits_to_try_again_is_answered_by_redis(
    cluster: RedisClusterServers, probe: RedisCluster
) -> None:
    """The slot's move ends while an admit that met TRYAGAIN waits to send again: sent again, it is
    answered MOVED, follows the slot to its new node and is counted there."""
    await probe.initialize()
    user = f"e-{uuid.uuid4().hex}"
    limits = tier(requests=100, request_window_s=3600)
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=5000, cluster=True)
    try:
        assert (await limiter.admit(user, "r1", limits, 10, 10)).decision.allowed
        source, target, slot, left = _start_migration(cluster, probe, user)
        tried = _count("floodgate_limiter_cluster_redirects_total", reply="TRYAGAIN")
        busy = _count("floodgate_limiter_slot_busy_total", op="admit")
        admit = asyncio.create_task(limiter.admit(user, "r2", limits, 10, 10))
        while _count("floodgate_limiter_cluster_redirects_total", reply="TRYAGAIN") == tried:
            assert not admit.done()
            await asyncio.sleep(0)
        # The admit waits out its first pause (a timer: this blocking block runs first).
        _end_migration(source, target, slot, left)

        assert (await admit).decision.allowed
        assert _count("floodgate_limiter_slot_busy_total", op="admit") == busy
        assert not limiter.fallback_active
        conc = user_keys(user)[2]
        assert target.command("ZSCORE", conc, "r2") != b"$-1\r\n"  # counted on Redis, where the slot went
    finally:
        await limiter.aclose()


def _wait_cluster_ok(nodes: list[RedisServer]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not all(b"cluster_state:ok" in node.command("CLUSTER", "INFO") for node in nodes):
        assert time.monotonic() < deadline, "the cluster did not recover"
        time.sleep(0.05)


def _wait_promoted(replica: RedisServer) -> None:
    deadline = time.monotonic() + SETTLE_S
    while b"role:master" not in replica.command("INFO", "replication"):
        assert time.monotonic() < deadline, "the replica was not promoted"
        time.sleep(0.05)  # the cluster's own failover, polled, bounded


@asynccontextmanager
async def _own_cluster(
    timeout_ms: int, **start: Any
) -> AsyncIterator[tuple[RedisClusterServers, RedisCluster, RedisLimiter]]:
    """A Cluster this test alone uses (and breaks), a probe with its slot map, and a limiter on it
    that retries Redis at once after a failure (no backoff)."""
    cluster = start_redis_cluster(**start)
    probe = RedisCluster.from_url(cluster.url)
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=timeout_ms, cluster=True, backoff_s=0)
    try:
        await probe.initialize()
        yield cluster, probe, limiter
    finally:
        await limiter.aclose()
        await probe.aclose()
        cluster.stop()


def _users_off_seed(cluster: RedisClusterServers, probe: RedisCluster) -> Iterator[str]:
    """Users whose keys are not on the URL's node: it stays up, maps are reloaded from it."""
    seed = cluster.nodes[0]
    users = (f"u-{uuid.uuid4().hex}" for _ in range(1000))
    return (u for u in users if _node_holding(cluster, probe, u) is not seed)


async def test_a_lost_node_is_a_store_failure_until_its_slots_are_served_elsewhere() -> None:
    """A node dies; while its slots are unserved its users' admits are a store failure (this tier
    fails closed); once another node serves them (here the operator's CLUSTER ADDSLOTS, in
    production a replica's promotion) the limiter reloads the slot map and admits there. Nothing
    else reloads it here: this instance counted nothing on the lost node, so its restore after
    the failure touches only the live ones."""
    async with _own_cluster(timeout_ms=2000, n=3) as (cluster, probe, limiter):
        users = _users_off_seed(cluster, probe)
        user = next(users)
        lost = _node_holding(cluster, probe, user)
        elsewhere = next(u for u in users if _node_holding(cluster, probe, u) is not lost)
        assert (await limiter.admit(elsewhere, "e1", tier(), 10, 10)).decision.allowed  # the map, loaded

        lost_id = _node_id(lost)
        ranges = next(
            line.split()[8:]
            for line in lost.command("CLUSTER", "NODES").decode().splitlines()
            if "myself" in line
        )
        lost.kill()
        closed = tier(on_store_failure="closed")
        with pytest.raises(StoreUnavailable):
            await limiter.admit(user, "r1", closed, 10, 10)

        survivors = [node for node in cluster.nodes if node is not lost]
        for node in survivors:
            _ok(node.command("CLUSTER", "FORGET", lost_id))
        bounds = [str(b) for r in ranges for b in (r.split("-") if "-" in r else (r, r))]
        _ok(survivors[0].command("CLUSTER", "ADDSLOTSRANGE", *bounds))
        _wait_cluster_ok(survivors)

        admitted = await limiter.admit(user, "r2", closed, 10, 10)
        assert admitted.decision.allowed and not limiter.fallback_active
        assert _admits_on_own_connection(survivors[0])
        assert await probe.exists(user_keys(user)[2])  # the user's slots, on the node now serving them


async def test_a_primary_failed_over_to_its_replica_admits_none_too_many_and_the_limiter_returns() -> None:
    """Production's Cluster keeps a replica per shard: a primary dies and its replica is promoted
    (cluster-node-timeout 2 s here: a busy CI box must not fail nodes over by itself). A user
    holding every concurrency slot of the tier gets no more while the shard is down (the local
    fallback answers) nor after (the limiter reloads the slot map, puts back what it counted and
    decides on the new primary); a slot freed there then admits again."""
    async with _own_cluster(
        timeout_ms=1000, n=6, replicas=1, extra_args=["--cluster-node-timeout", "2000"]
    ) as (cluster, probe, limiter):
        user = next(_users_off_seed(cluster, probe))
        primary = _node_holding(cluster, probe, user)
        (replica,) = [
            node
            for node in cluster.nodes
            if f"master_port:{primary.port}\r\n".encode() in node.command("INFO", "replication")
        ]
        limits = tier(concurrent=3)
        held = [await limiter.admit(user, f"held-{i}", limits, 10, 10) for i in range(3)]
        assert all(a.decision.allowed for a in held)

        reloads = _count("floodgate_limiter_slot_map_reloads_total")
        primary.kill()
        during = await limiter.admit(user, "during", limits, 10, 10)
        assert limiter.fallback_active and not during.decision.allowed
        assert during.decision.limit == "concurrency"

        _wait_promoted(replica)
        _wait_cluster_ok([node for node in cluster.nodes if node is not primary])

        # The first call after the promotion may still go where the old map says; each failure
        # reloads it. Bounded, no waiting between.
        for attempt in range(5):
            after = await limiter.admit(user, f"after-{attempt}", limits, 10, 10)
            assert not after.decision.allowed and after.decision.limit == "concurrency"
            if not limiter.fallback_active:
                break
        assert not limiter.fallback_active  # decided on the new primary
        assert _count("floodgate_limiter_slot_map_reloads_total") > reloads  # the ops' view
        assert await probe.zcard(user_keys(user)[2]) == 3  # the three held slots, on the new primary

        lease = held[0].lease
        assert lease is not None
        await lease.settle()
        freed = await limiter.admit(user, "freed", limits, 10, 10)
        assert freed.decision.allowed and not limiter.fallback_active
        assert _admits_on_own_connection(replica)


async def test_connect_opens_a_connection_to_every_primary_before_any_call(
    cluster: RedisClusterServers,
) -> None:
    limiter = RedisLimiter.from_url(cluster.url, timeout_ms=5000, cluster=True)
    try:
        await limiter.connect()
        for node in cluster.nodes:
            assert [c for c in node.clients() if c["name"] == CLIENT_NAME], node.port
    finally:
        await limiter.aclose()
