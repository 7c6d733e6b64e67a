"""GET /v1/models/{id}/stats on the public port: a real local engine's cache figures, next to a hung
Triton replica that must neither hold the answer nor have its address shown."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.config import Settings
from edge.upstreams.base import Upstream
from edge.upstreams.local_pool import local_upstreams
from edge.upstreams.triton import triton_upstreams
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, wait_until
from tests.faults.hung_replica import hung_address
from tests.support.live_server import LiveServer, start_server

# Far under what waiting on the hung replica would cost (its health checks time out after 2 s).
ANSWER_TIMEOUT_S = 1.5
STATS = f"/v1/models/{MODEL}/stats"
# Long enough to fill several 16-token KV blocks, which the second request then finds cached.
SHARED = "You are a careful assistant. Answer in one short sentence. " * 4


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    with ExitStack() as stack:
        hung = stack.enter_context(hung_address())
        spec = f"{hung}:{hung.rsplit(':', 1)[1]}"  # HOST:GRPC_PORT:METRICS_PORT, both silent

        @asynccontextmanager
        async def provide(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
            async with AsyncExitStack() as replicas:
                local = await replicas.enter_async_context(local_upstreams(settings, model_dir))
                remote = await replicas.enter_async_context(triton_upstreams(spec)(settings, model_dir))
                yield [*local, *remote]

        live = stack.enter_context(start_server(tmp_path, {"tiers": ROOMY_TIERS}, provide))
        yield live, hung


def _stats(server: LiveServer, who: str = "free") -> dict[str, Any]:
    answer = httpx.get(server.base_url + STATS, headers=server.auth(who), timeout=ANSWER_TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_any_key_sees_each_replicas_cache_figures_numbered_not_named(server: tuple[LiveServer, str]) -> None:
    live, hung = server
    for question in ("What is a river?", "What is a lake?"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": SHARED + question}], "max_tokens": 4}
        answer = httpx.post(live.base_url + CHAT, json=body, headers=live.auth("paid"), timeout=60)
        assert answer.status_code == 200

    def local_hits() -> int:
        figures = _stats(live)["replicas"][0]["figures"]
        return int(figures["prefix_cache"]["hit_tokens"]) if figures else 0

    # The figures are the last health poll's (about once a second): the second prompt's hit shows soon.
    wait_until(lambda: local_hits() > 0, timeout_s=30, what="the local replica's prefix-cache hit")
    stats = _stats(live)
    assert stats["object"] == "model.stats" and stats["model"] == MODEL
    local, remote = stats["replicas"]
    assert local["replica"] == 1 and local["ready"] is True
    figures = local["figures"]
    cache, blocks = figures["prefix_cache"], figures["kv_blocks"]
    assert 0 < cache["hit_tokens"] < cache["query_tokens"]
    assert cache["hit_rate"] == pytest.approx(cache["hit_tokens"] / cache["query_tokens"])
    # Both prompts ended: nothing held, their full blocks kept as cache, the rest free.
    assert blocks["used"] == 0 and blocks["cached"] > 0
    assert blocks["used"] + blocks["cached"] + blocks["free"] == live.settings.engine.num_blocks
    assert figures["preemptions"] == 0 and figures["running"] == 0
    # The hung replica: listed, not ready, no figures; and nobody learns where the replicas are.
    assert remote == {"replica": 2, "ready": False, "figures": None}
    text = httpx.get(live.base_url + STATS, headers=live.auth("free"), timeout=ANSWER_TIMEOUT_S).text
    assert "local-0" not in text and hung not in text and hung.rsplit(":", 1)[1] not in text


def test_stats_need_a_key_and_a_model_the_tier_may_use(server: tuple[LiveServer, str]) -> None:
    live, _ = server
    assert httpx.get(live.base_url + STATS, timeout=ANSWER_TIMEOUT_S).status_code == 401
    unknown = httpx.get(
        live.base_url + "/v1/models/no-such-model/stats", headers=live.auth("paid"), timeout=ANSWER_TIMEOUT_S
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
