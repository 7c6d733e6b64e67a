"""Fleet membership on a real Redis Cluster that stops answering without refusing (every node
SIGSTOPped: a frozen host, a network that drops packets): one beat waits one timeout, as on a
single Redis, and the fallback to instance_count lands within stale_after_s and one beat. redis-py's
Cluster client retried each beat (a topology refresh, the node again) for four timeouts, twenty
seconds at the default heartbeat_s, and the fallback came beats later."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import anyio
import pytest

from edge.membership.membership import FleetMembership, MembershipSettings
from edge.membership.shares import FleetView
from limiter import redis_url
from tests.support.redis_server import RedisClusterServers, start_redis_cluster
from tests.support.silent_nodes import silenced

pytestmark = pytest.mark.anyio
TIMEOUT_S = 0.5  # the client's, and the beat period (as edge_fleet.py makes them)
WAIT_S = 30.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    servers = start_redis_cluster(3)
    yield servers
    servers.stop()


def _settings(stale_after_s: float) -> MembershipSettings:
    return MembershipSettings(
        interval_s=TIMEOUT_S,
        join_wait_s=TIMEOUT_S,
        ttl_s=3 * TIMEOUT_S,
        stale_after_s=stale_after_s,
        fleet=f"silent-{uuid.uuid4().hex[:8]}",
    )


async def _beat_until_answered(member: FleetMembership) -> None:
    """Beats until one is answered by the cluster, within WAIT_S: a beat on a starved machine (eight
    test processes on two cores) found the cluster still slower than the client's half-second
    timeout (`stale`) before anything was silenced, and asserting the first beat failed there."""
    deadline = time.monotonic() + WAIT_S
    while (await member.beat_once()).source != "redis":
        assert time.monotonic() < deadline, f"no beat reached the cluster within {WAIT_S:.0f} s"


async def test_a_beat_to_a_silent_cluster_waits_one_timeout(cluster: RedisClusterServers) -> None:
    settings = _settings(stale_after_s=10.0)
    client = redis_url.connect(
        cluster.url, cluster=True, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
    )
    member = FleetMembership(client, "host:1:aaaa1111", settings)
    try:
        await _beat_until_answered(member)
        with silenced(cluster.nodes):
            started = time.monotonic()
            view = await member.beat_once()
            took = time.monotonic() - started
        assert view.source == "stale"
        assert took < 2 * TIMEOUT_S, f"one beat took {took:.2f}s, {took / TIMEOUT_S:.1f} timeouts"
        # The beat cut short leaves the client sound: a later one reaches the cluster again.
        await _beat_until_answered(member)
    finally:
        await member.aclose()
        await client.aclose()


async def test_the_fallback_lands_within_stale_after_and_one_beat(cluster: RedisClusterServers) -> None:
    """Measured on the membership's own clock, from the last moment Redis answered at the latest
    (the silence's start): the beat that starts stale_after_s after the last good one starts up to
    a beat period and a beat later, and ends one more beat's wait later."""
    settings = _settings(stale_after_s=3 * TIMEOUT_S)
    client = redis_url.connect(
        cluster.url, cluster=True, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
    )
    fell_back = anyio.Event()
    fallback_at: list[float] = []

    def on_change(view: FleetView) -> None:
        if view.source == "fallback" and not fallback_at:
            fallback_at.append(time.monotonic())
            fell_back.set()

    member = FleetMembership(client, "host:1:aaaa1111", settings, on_change, clock=time.monotonic)
    try:
        assert (await member.start()).source == "redis"
        with silenced(cluster.nodes):
            silent_from = time.monotonic()
            with anyio.fail_after(WAIT_S):
                await fell_back.wait()
        late = fallback_at[0] - silent_from
        bound = settings.stale_after_s + settings.interval_s + 2 * TIMEOUT_S
        assert late <= bound, f"fallback {late:.2f}s after the silence began, above {bound:.2f}s"
    finally:
        await member.aclose()
        await client.aclose()
