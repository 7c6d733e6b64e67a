"""A cancel on a real Redis Cluster that went silent (every node SIGSTOPped, not refusing) answers
unavailable (503) after one of the bus's timeouts, as on a single Redis: redis-py's Cluster client
retried it (a topology refresh, the node again) for four timeouts, then eight at the next cancel,
the user's cancel call hanging meanwhile. Once the cluster answers again, so does the bus."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from edge.cancel.bus import CancelBusUnavailable, RedisCancelBus
from edge.cancel.outcome import CancelOutcome
from tests.support.redis_server import RedisClusterServers, start_redis_cluster
from tests.support.silent_nodes import silenced

pytestmark = pytest.mark.anyio
# Long enough that a loaded machine answers a call to a live node within it (at 250 ms the first
# cancel after the nodes woke, reconnecting, timed out in a fresh-clone CI run); the stacking it
# guards against took four to eight of them.
TIMEOUT_MS = 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    servers = start_redis_cluster(3)
    yield servers
    servers.stop()


async def test_a_cancel_on_a_silent_cluster_waits_one_timeout(cluster: RedisClusterServers) -> None:
    timeout_s = TIMEOUT_MS / 1000
    bus = RedisCancelBus.from_url(f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}", timeout_ms=TIMEOUT_MS)
    await bus.start(lambda request_id, user: None)
    try:
        assert await bus.cancel("req-u1", "alice") is CancelOutcome.NOT_FOUND
        with silenced(cluster.nodes):
            for attempt in range(2):  # the second found a refresh due, and stacked more
                started = time.monotonic()
                with pytest.raises(CancelBusUnavailable):
                    await bus.cancel("req-u1", "alice")
                took = time.monotonic() - started
                assert took < 2 * timeout_s, (
                    f"cancel {attempt} took {took:.2f}s, {took / timeout_s:.1f} timeouts"
                )
        assert await _answered(bus) is CancelOutcome.NOT_FOUND
    finally:
        await bus.aclose()


async def _answered(bus: RedisCancelBus) -> CancelOutcome:
    """The cancel's answer once the woken cluster answers: a call may still meet a connection the
    silence left behind (each such call answers unavailable within its one timeout)."""
    for _ in range(5):
        try:
            return await bus.cancel("req-u1", "alice")
        except CancelBusUnavailable:
            continue
    raise AssertionError("the bus never answered once the cluster woke")
