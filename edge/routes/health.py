"""GET /healthz (the process answers) and GET /readyz (a replica can take work)."""

from __future__ import annotations

from typing import Any

import anyio
from litestar import Request, get
from litestar.response.base import ASGIResponse

from edge.routes.json_body import json_response
from edge.runtime import runtime_of
from edge.upstreams.base import Upstream

_READY_TIMEOUT_S = 2.0


@get("/healthz")
async def healthz() -> ASGIResponse:
    return json_response({"status": "ok"})


async def _ready(upstream: Upstream) -> bool:
    with anyio.move_on_after(_READY_TIMEOUT_S):
        try:
            return await upstream.ready()
        except Exception:
            return False
    return False


@get("/readyz")
async def readyz(request: Request[Any, Any, Any]) -> ASGIResponse:
    state = request.app.state
    if "runtime" not in state:
        return json_response({"status": "starting", "replicas": {}}, status_code=503)
    replicas = {u.name: await _ready(u) for u in runtime_of(request).upstreams}
    ready = any(replicas.values())
    return json_response(
        {"status": "ready" if ready else "unavailable", "replicas": replicas}, 200 if ready else 503
    )
