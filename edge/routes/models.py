"""GET /v1/models: the one model this edge serves."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response.base import ASGIResponse

from edge.routes.json_body import json_response
from edge.runtime import runtime_of

# Models have no creation time here; OpenAI's field is required, so a fixed one is sent.
_CREATED = 1_700_000_000


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> ASGIResponse:
    runtime = runtime_of(request)
    runtime.keys.authenticate(request.headers.get("authorization"))
    name = runtime.settings.model.name
    model = {"id": name, "object": "model", "created": _CREATED, "owned_by": "floodgate"}
    return json_response({"object": "list", "data": [model]})
