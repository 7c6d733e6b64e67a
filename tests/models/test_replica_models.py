"""Each replica says which model it serves: its gauges carry a `model` label, and the operator's
/readyz and /v1/internal/engine name its model.

A replica's name need not say: a remote Triton replica is `triton-host:port` whatever model it
serves, so on a two-model Triton deployment an operator could not tell whose KV cache was full.
Here the demo model is served twice, as `small` and `large`, each by its own engine.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.models.conftest import LARGE, SMALL
from tests.support.live_server import LiveServer

# Every per-replica gauge a replica that answered its health poll has (the hit rate needs a lookup).
PER_REPLICA = (
    "floodgate_replica_running_sequences",
    "floodgate_replica_waiting_sequences",
    "floodgate_replica_kv_tokens_used",
    "floodgate_replica_kv_tokens",
    "floodgate_replica_kv_blocks",
    "floodgate_replica_kv_utilisation",
    "floodgate_replica_prefix_cache_hit_tokens",
    "floodgate_replica_prefix_cache_query_tokens",
    "floodgate_replica_preemptions",
    "floodgate_replica_restarts",
)


def _replicas(server: LiveServer) -> dict[str, str]:
    """Each replica's name, and the model whose dispatcher holds it."""
    pipelines = server.app.state.runtime.models.pipelines()
    return {name: model for model, p in pipelines for name in p.dispatcher.upstream_names()}


def test_each_replicas_gauges_carry_its_model(two_models: LiveServer) -> None:
    mine = _replicas(two_models)
    assert sorted(mine.values()) == sorted([SMALL, LARGE])
    found: dict[str, set[tuple[str, str]]] = {family: set() for family in PER_REPLICA}
    for family in text_string_to_metric_families(two_models.metrics_text()):
        if family.name not in found:
            continue
        for sample in family.samples:
            replica = sample.labels["replica"]
            if replica in mine:  # the registry is the process's: other tests' replicas too
                found[family.name].add((sample.labels.get("model", "(none)"), replica))
    expected = {(model, name) for name, model in mine.items()}
    assert found == dict.fromkeys(PER_REPLICA, expected)


def test_readiness_and_engine_state_name_each_replicas_model(two_models: LiveServer) -> None:
    mine = _replicas(two_models)
    ready = httpx.get(two_models.ops_url + "/readyz", timeout=30).json()
    assert ready["models"] == {model: [n for n, m in mine.items() if m == model] for model in (SMALL, LARGE)}
    engine = httpx.get(two_models.ops_url + "/v1/internal/engine", timeout=30).json()["replicas"]
    assert {r["name"]: r.get("model") for r in engine} == mine
