"""GET /v1/models and /v1/models/{id}: the models the caller's tier may use, its default first.

A model the tier may not use is a 404 model_not_found, the same body as for one that does not
exist (edge/models/catalog.py).
"""

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
    principal = await runtime.keys.authenticate(request.headers.get("authorization"))
    cards = [_model_card(name) for name in runtime.models.models_for(principal.tier)]
    return json_response({"object": "list", "data": cards})


@get("/v1/models/{model_id:str}")
async def retrieve_model(request: Request[Any, Any, Any], model_id: FromPath[str]) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await runtime.keys.authenticate(request.headers.get("authorization"))
    if model_id not in runtime.models.models_for(principal.tier):
        raise unknown_model(model_id)
    return json_response(_model_card(model_id))
