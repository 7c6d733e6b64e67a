"""GET /v1/models and /v1/models/{id}: the models the caller's tier may use, its default first.

A model the tier may not use is a 404 model_not_found, the same body as for one that does not
exist (edge/models/catalog.py).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.params import FromPath
from litestar.response.base import ASGIResponse

from edge.routes.caller import caller
from edge.routes.json_body import json_response
from edge.runtime import runtime_of
from edge.schemas import unknown_model

# Models have no creation time here; OpenAI's field is required, so a fixed one is sent.
_CREATED = 1_700_000_000


def _model_card(name: str, max_model_len: int) -> dict[str, Any]:
    """OpenAI's fields, and vLLM's `max_model_len`: without it a client learns the context only from
    a 400 (prompt and completion together must fit in it)."""
    return {
        "id": name,
        "object": "model",
        "created": _CREATED,
        "owned_by": "floodgate",
        "max_model_len": max_model_len,
    }


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await caller(runtime, request)
    models = runtime.models
    cards = [_model_card(name, models.max_model_len(name)) for name in models.models_for(principal.tier)]
    return json_response({"object": "list", "data": cards})


@get("/v1/models/{model_id:str}")
async def retrieve_model(request: Request[Any, Any, Any], model_id: FromPath[str]) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await caller(runtime, request)
    if model_id not in runtime.models.models_for(principal.tier):
        raise unknown_model(model_id)
    return json_response(_model_card(model_id, runtime.models.max_model_len(model_id)))
