"""Two edge instances sharing one real Redis (standalone, a 3-node Cluster, and a 3-node Cluster
taking TLS only, as production's ElastiCache does): limits and cancels hold across the fleet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from limiter.resp_connection import CLIENT_NAME
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, LONG_TOKENS, MODEL, events
from tests.support.holding_limiter import HOLD_TIMEOUT_S, holding
from tests.support.live_server import LiveServer, start_server
from tests.support.redis_server import RedisServer, start_redis, start_redis_cluster
from tests.support.tls_files import make_tls_files


@pytest.fixture(scope="module", params=["standalone", "cluster", "cluster-tls"])
def redis_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Any], list[RedisServer]]]:
    """The limiter settings of a real Redis and its servers: one server, or a Cluster (keys and
    pub/sub through it), plain or over TLS (a `rediss://` URL trusting the test's own CA)."""
    if request.param.startswith("cluster"):
        tls = make_tls_files(tmp_path_factory.mktemp("tls")) if request.param == "cluster-tls" else None
        cluster = start_redis_cluster(3, tls=tls)
        yield {"redis_url": cluster.url, "redis_cluster": True}, cluster.nodes
        cluster.stop()
    else:
        server = start_redis()
        yield {"redis_url": server.url, "redis_cluster": False}, [server]
        server.stop()


@pytest.fixture
def redis_store(redis_servers: tuple[dict[str, Any], list[RedisServer]]) -> dict[str, Any]:
    return redis_servers[0]


@pytest.fixture
def fleet(tmp_path: Path, redis_store: dict[str, Any]) -> Iterator[tuple[LiveServer, LiveServer]]:
    # A store call past timeout_ms (250 ms by default) switches an instance to its local share of
    # the limits, which changes the answers asserted here. Both edges, their engines and the test
    # share one process on a 2-core CI box, where a busy suite can stall an edge's event loop that
    # long; the fallback has its own tests (tests/limiter/test_redis_failure.py).
    overrides = {
        "limiter": {"backend": "redis", "instance_count": 2, "timeout_ms": 2000, **redis_store},
        "tiers": {"paid": ROOMY_TIERS["paid"], "free": ROOMY_TIERS["free"] | {"requests_per_window": 3}},
    }
    # One key store for both, as instances behind one load balancer share it.
    with start_server(tmp_path, overrides) as a:
        shared_keys = {"keys": {"sqlite_path": a.settings.keys.sqlite_path}}
        with start_server(tmp_path / "b", overrides | shared_keys) as b:
            yield a, b


def test_a_cancel_sent_to_another_instance_stops_the_stream(
    fleet: tuple[LiveServer, LiveServer], long_body: dict[str, Any]
) -> None:
    a, b = fleet
    with httpx.Client(timeout=30) as client:
        for _ in range(3):
            with client.stream("POST", a.base_url + CHAT, json=long_body, headers=a.auth("paid")) as response:
                stream = events(response)
                # Right after the first event: the request must already be live in Redis (its limiter slot).
                rid = next(stream)["request_id"]
                cancel = client.post(f"{b.base_url}{CHAT}/{rid}/cancel", headers=a.auth("paid"))
                assert cancel.status_code == 200
                rest = list(stream)
            assert rest[-1] == DONE
            assert rest[-2]["floodgate"] == {"cancelled": True}


@pytest.mark.parametrize("first_to", ["its own instance", "the other instance"])
def test_a_cancel_repeated_after_the_stream_ended_answers_as_the_first_on_every_instance(
    fleet: tuple[LiveServer, LiveServer], long_body: dict[str, Any], first_to: str
) -> None:
    """A client retrying its cancel (a lost answer, a timeout) reaches any instance behind the load
    balancer. Once the stream a cancel ended had settled, an instance other than the one that ran
    it read the store, which kept no cancel past the settle, and answered 409 `request_finished`,
    as if the request had run to its end, where the instance that ran it answered 200 CANCELLED. A
    request that ended on its own stays 409 on every instance."""
    a, b = fleet
    first_server = a if first_to == "its own instance" else b
    short = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", a.base_url + CHAT, json=long_body, headers=a.auth("paid")) as response:
            stream = events(response)
            rid = next(stream)["request_id"]
            first = client.post(f"{first_server.base_url}{CHAT}/{rid}/cancel", headers=a.auth("paid"))
            rest = list(stream)  # its settle lands before its last events
        again = [client.post(f"{s.base_url}{CHAT}/{rid}/cancel", headers=a.auth("paid")) for s in (b, a)]
        stranger = client.post(f"{b.base_url}{CHAT}/{rid}/cancel", headers=a.auth("free"))
        with client.stream("POST", a.base_url + CHAT, json=short, headers=a.auth("paid")) as response:
            stream = events(response)
            own_rid = next(stream)["request_id"]
            own_rest = list(stream)
        own = [client.post(f"{s.base_url}{CHAT}/{own_rid}/cancel", headers=a.auth("paid")) for s in (b, a)]

    assert first.status_code == 200, first.text
    assert rest[-2]["floodgate"] == {"cancelled": True}
    cancelled = {"request_id": rid, "status": "CANCELLED"}
    assert [(r.status_code, r.json()) for r in again] == [(200, cancelled), (200, cancelled)]
    assert stranger.status_code == 404  # still not another user's to probe
    assert own_rest[-1] == DONE
    assert "floodgate" not in own_rest[-2]
    assert [(r.status_code, r.json()["error"]["code"]) for r in own] == [(409, "request_finished")] * 2


def test_a_cancel_sent_while_the_other_instances_subscription_reconnects_stops_the_stream(
    fleet: tuple[LiveServer, LiveServer],
    long_body: dict[str, Any],
    redis_servers: tuple[dict[str, Any], list[RedisServer]],
) -> None:
    """A's cancel subscription drops (a reset, a failover) just before B answers a cancel 200: the
    broadcast may reach nobody, yet the store marked the request, which A reads on resubscribing."""
    a, b = fleet
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", a.base_url + CHAT, json=long_body, headers=a.auth("paid")) as response:
            stream = events(response)
            rid = next(stream)["request_id"]
            for node in redis_servers[1]:
                node.command("CLIENT", "KILL", "TYPE", "pubsub")
            cancel = client.post(f"{b.base_url}{CHAT}/{rid}/cancel", headers=a.auth("paid"))
            rest = list(stream)
    assert cancel.status_code == 200
    assert rest[-1] == DONE
    assert rest[-2]["floodgate"] == {"cancelled": True}
    tokens = [
        e
        for e in rest
        if isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"].get("content")
    ]
    assert len(tokens) < LONG_TOKENS // 2


def test_a_cancel_that_reaches_the_store_as_the_stream_ends_on_its_own_ends_it_cancelled(
    fleet: tuple[LiveServer, LiveServer],
) -> None:
    """Instance A's generation is over (its outcome decided here: no cancel) but its settle, which
    frees the slot and marks the request done in the store, has not landed; a cancel sent to B
    then still finds the request running there and answers 200. A stream whose cancel was answered
    200 must end cancelled: A learns of it from its settle's answer, whether or not B's broadcast
    reached it first (it arrives after A's own end, which then ignores it)."""
    a, b = fleet
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with httpx.Client(timeout=60) as client, holding(a) as held:
        with client.stream("POST", a.base_url + CHAT, json=body, headers=a.auth("paid")) as response:
            stream = events(response)
            rid = next(stream)["request_id"]
            assert held.settling.wait(HOLD_TIMEOUT_S)  # the 4 tokens are out; the settle waits
            cancel = client.post(f"{b.base_url}{CHAT}/{rid}/cancel", headers=a.auth("paid"))
            held.release.set()
            rest = list(stream)
        again = client.post(f"{b.base_url}{CHAT}/{rid}/cancel", headers=a.auth("paid"))
        again_on_a = client.post(f"{a.base_url}{CHAT}/{rid}/cancel", headers=a.auth("paid"))

    assert cancel.status_code == 200, cancel.text
    assert rest[-1] == DONE
    final = [e for e in rest if isinstance(e, dict) and e.get("choices")][-1]
    assert final["floodgate"] == {"cancelled": True}
    # Repeated, the cancel answers as the first did: on B from the store, which kept it past the
    # settle; on A from its own registry, which learnt it from the settle (it answered 409).
    cancelled = (200, {"request_id": rid, "status": "CANCELLED"})
    assert (again.status_code, again.json()) == cancelled
    assert (again_on_a.status_code, again_on_a.json()) == cancelled


def test_request_limit_is_shared_by_the_instances(fleet: tuple[LiveServer, LiveServer]) -> None:
    a, b = fleet
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with httpx.Client(timeout=30) as client:
        statuses = [
            client.post(s.base_url + CHAT, json=body, headers=a.auth("free")).status_code
            for s in (a, b, a, b)
        ]
    assert statuses == [200, 200, 200, 429]


def test_each_instance_opens_its_limiter_connections_at_start(
    fleet: tuple[LiveServer, LiveServer], redis_servers: tuple[dict[str, Any], list[RedisServer]]
) -> None:
    """Before any request: every node holds one limiter connection of each edge (no handshake on
    the first requests' way)."""
    _, nodes = redis_servers
    for node in nodes:
        assert len([c for c in node.clients() if c["name"] == CLIENT_NAME]) >= 2, node.port
