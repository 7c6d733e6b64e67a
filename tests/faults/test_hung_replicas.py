"""Drill: three hung Triton replicas next to one healthy in-process replica.

Readiness and the operator endpoints read the replica state the dispatcher keeps from its own
(bounded, concurrent) health polls, so they answer at once: before, each polled every replica in
turn with a 2 s timeout, and three hung replicas made every edge miss the load balancer's health
check. The client timeouts below sit under those 3 × 2 s. The operator endpoints are not on the
public port at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest

from edge.config import Settings
from edge.upstreams.base import Upstream
from edge.upstreams.local_pool import local_upstreams
from edge.upstreams.triton import triton_upstreams
from tests.faults.hung_replica import hung_address
from tests.support.live_server import LiveServer, start_server

HUNG = 3
# Far under the old cost of one readiness check (HUNG replicas × 2 s, one after the other).
ANSWER_TIMEOUT_S = 5.0
CHAT = "/v1/chat/completions"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with ExitStack() as stack:
        hung = [stack.enter_context(hung_address()) for _ in range(HUNG)]
        # HOST:GRPC_PORT:METRICS_PORT: both ports of each replica are the silent listener.
        spec = ",".join(f"{address}:{address.rsplit(':', 1)[1]}" for address in hung)

        @asynccontextmanager
        async def provide(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
            async with AsyncExitStack() as replicas:
                local = await replicas.enter_async_context(local_upstreams(settings, model_dir))
                remote = await replicas.enter_async_context(triton_upstreams(spec)(settings, model_dir))
                yield [*local, *remote]

        yield stack.enter_context(start_server(tmp_path, {}, provide))


def test_readiness_and_metrics_never_wait_on_hung_replicas(server: LiveServer) -> None:
    ready = httpx.get(server.ops_url + "/readyz", timeout=ANSWER_TIMEOUT_S)
    assert ready.status_code == 200
    replicas = ready.json()["replicas"]
    assert replicas.pop("local-0") is True
    assert len(replicas) == HUNG and not any(replicas.values())

    metrics = httpx.get(server.ops_url + "/metrics", timeout=ANSWER_TIMEOUT_S)
    assert metrics.status_code == 200
    assert 'floodgate_replica_kv_tokens{model="",replica="local-0"}' in metrics.text

    engine = httpx.get(server.ops_url + "/v1/internal/engine", timeout=ANSWER_TIMEOUT_S).json()
    reachable = {r["name"]: r["reachable"] for r in engine["replicas"]}
    assert reachable.pop("local-0") is True and not any(reachable.values())

    # The healthy replica serves meanwhile.
    body = {"model": "floodgate-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    answer = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=60)
    assert answer.status_code == 200


def test_operator_endpoints_are_not_on_the_public_port(server: LiveServer) -> None:
    for path in ("/metrics", "/v1/internal/engine"):
        hidden = httpx.get(server.base_url + path, timeout=ANSWER_TIMEOUT_S)
        assert hidden.status_code == 404
        assert "error" in hidden.json()
    assert httpx.get(server.ops_url + "/metrics", timeout=ANSWER_TIMEOUT_S).status_code == 200
