"""GET /v1/models and /v1/models/{id}: the models the caller's tier may use, its default first.

A model the tier may not use is a 404 model_not_found, the same body as for one that does not
exist (edge/models/catalog.py). A key whose tier is not configured gets chat's 403 unknown_tier:
an empty list read as an edge that serves nothing.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.params import FromPath
from litestar.response.base import ASGIResponse

from edge.openapi import ApiOperation
from edge.routes.caller import caller
from edge.routes.json_body import json_response
from edge.runtime import Runtime, runtime_of
from edge.schemas import unknown_model, unknown_tier

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


async def _tier_models(runtime: Runtime, request: Request[Any, Any, Any]) -> list[str]:
    """What the caller's tier may use; raises chat's 403 for a tier that is not configured."""
    principal = await caller(runtime, request)
    if principal.tier not in runtime.settings.tiers:
        raise unknown_tier(principal.tier)
    return runtime.models.models_for(principal.tier)


@get("/v1/models", operation_class=ApiOperation)
async def list_models(request: Request[Any, Any, Any]) -> ASGIResponse:
    runtime = runtime_of(request)
    models = runtime.models
    cards = [_model_card(name, models.max_model_len(name)) for name in await _tier_models(runtime, request)]
    return json_response({"object": "list", "data": cards})


@get("/v1/models/{model_id:str}", operation_class=ApiOperation)
async def retrieve_model(request: Request[Any, Any, Any], model_id: FromPath[str]) -> ASGIResponse:
    runtime = runtime_of(request)
    if model_id not in await _tier_models(runtime, request):
        raise unknown_model(model_id)
    return json_response(_model_card(model_id, runtime.models.max_model_len(model_id)))
