"""GET /v1/models and /v1/models/{id}: the one model this edge serves."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.params import FromPath
from litestar.response.base import ASGIResponse

from edge.routes.json_body import json_response
from edge.runtime import runtime_of
from edge.schemas import unknown_model

# Models have no creation time here; OpenAI's field is required, so a fixed one is sent.
_CREATED = 1_700_000_000


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": _CREATED, "owned_by": "floodgate"}


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> ASGIResponse:
    runtime = runtime_of(request)
    await runtime.keys.authenticate(request.headers.get("authorization"))
    return json_response({"object": "list", "data": [_model_card(runtime.settings.model.name)]})


@get("/v1/models/{model_id:str}")
async def retrieve_model(request: Request[Any, Any, Any], model_id: FromPath[str]) -> ASGIResponse:
    runtime = runtime_of(request)
    await runtime.keys.authenticate(request.headers.get("authorization"))
    if model_id != runtime.settings.model.name:
        raise unknown_model(model_id)
    return json_response(_model_card(model_id))
