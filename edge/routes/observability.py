"""GET /metrics (Prometheus) and GET /v1/internal/engine (each replica's load, as JSON)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response.base import ASGIResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from edge.metrics import record_capacity
from edge.routes.json_body import json_response
from edge.runtime import runtime_of
from edge.upstreams.base import Capacity


async def _capacities(request: Request[Any, Any, Any]) -> dict[str, Capacity | None]:
    out: dict[str, Capacity | None] = {}
    for upstream in runtime_of(request).upstreams:
        try:
            out[upstream.name] = await upstream.capacity()
        except Exception:
            out[upstream.name] = None
    return out


@get("/metrics")
async def prometheus_metrics(request: Request[Any, Any, Any]) -> ASGIResponse:
    for name, cap in (await _capacities(request)).items():
        if cap is not None:
            record_capacity(name, cap)
    return ASGIResponse(body=generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


@get("/v1/internal/engine")
async def engine_state(request: Request[Any, Any, Any]) -> ASGIResponse:
    replicas = [
        {"name": name, "reachable": cap is not None}
        | (
            {}
            if cap is None
            else {
                "running": cap.running,
                "waiting": cap.waiting,
                "kv_tokens_used": cap.kv_tokens_used,
                "kv_tokens_total": cap.kv_tokens_total,
                "max_sequences": cap.max_sequences,
            }
        )
        for name, cap in (await _capacities(request)).items()
    ]
    return json_response({"replicas": replicas})
