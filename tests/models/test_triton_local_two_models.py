"""`floodgate serve --triton local` beside another model: each model starts a tritonserver of its
own, and each is a replica of its own in readiness and the metrics."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.live_server import start_server

TWO_LOCAL = {
    "upstream": {"triton": "local"},
    "models": {"small": {"source": "demo"}, "large": {"source": "demo", "token_weight": 2.0}},
    "tiers": {"paid": {"models": [], "default_model": ""}, "free": {"models": [], "default_model": ""}},
    "engine": {"num_blocks": 256},
}


def test_each_models_local_tritonserver_is_a_replica_of_its_own(tmp_path: Path) -> None:
    with start_server(tmp_path, TWO_LOCAL) as server:
        ready = httpx.get(server.ops_url + "/readyz", timeout=30).json()
        metrics = server.metrics_text()
    assert ready["replicas"] == {"small/triton-local": True, "large/triton-local": True}
    for model in ("small", "large"):
        assert f'floodgate_replica_kv_tokens{{model="{model}",replica="{model}/triton-local"}}' in metrics
