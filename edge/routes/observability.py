"""GET /metrics (Prometheus) and GET /v1/internal/engine (each replica's load, as JSON).

Operator endpoints: they answer only on the operator listener (`[server] ops_host:ops_port`,
edge/routes/listeners.py) and 404 on the public one, so nothing the load balancer routes can reach
them; the public OpenAPI document leaves them out for the same reason.
Both read the replica state the dispatcher keeps from its health polls (at most one poll interval
old): a hung replica never holds a scrape.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response.base import ASGIResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from edge.metrics import record_capacities
from edge.routes.json_body import json_response
from edge.routes.listeners import OPERATOR_ONLY
from edge.runtime import runtime_of


@get("/metrics", opt=OPERATOR_ONLY, include_in_schema=False)
async def prometheus_metrics(request: Request[Any, Any, Any]) -> ASGIResponse:
    states = runtime_of(request).models.replica_states()
    capacities = {(r.model, r.name): r.capacity for r in states if r.capacity is not None}
    state = request.app.state
    if not hasattr(state, "replicas_recorded"):
        state.replicas_recorded = set()
    alive = {(r.model, r.name): r.alive for r in states}
    record_capacities(capacities, state.replicas_recorded, alive)
    # The type as a header, not as media_type: Litestar adds "; charset=utf-8" to a text/ media
    # type, and CONTENT_TYPE_LATEST names its charset already. Named twice, Prometheus 3 (Go's
    # mime.ParseMediaType: "duplicate parameter name") could not parse it and failed every scrape.
    return ASGIResponse(body=generate_latest(REGISTRY), headers={"content-type": CONTENT_TYPE_LATEST})


@get("/v1/internal/engine", opt=OPERATOR_ONLY, include_in_schema=False)
async def engine_state(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Each replica as its last health poll found it, and what this edge holds on it."""
    replicas: list[dict[str, Any]] = []
    for r in runtime_of(request).models.replica_states():
        entry: dict[str, Any] = {
            "name": r.name,
            "model": r.model,
            "reachable": r.alive,
            "kv_tokens_held": r.kv_tokens_held,
            "sequences_held": r.sequences_held,
        }
        if r.capacity is not None:
            cap = r.capacity
            entry |= {
                "running": cap.running,
                "waiting": cap.waiting,
                "kv_tokens_used": cap.kv_tokens_used,
                "kv_tokens_total": cap.kv_tokens_total,
                "max_sequences": cap.max_sequences,
            }
        replicas.append(entry)
    return json_response({"replicas": replicas})
