"""POST /v1/chat/completions: streaming (SSE) or one JSON answer."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Scope

from edge.openapi import ChatCompletionOperation
from edge.routes.json_body import json_response
from edge.runtime import runtime_of
from edge.schemas import parse_chat_request
from edge.streaming import EventStreamResponse, until_disconnect


def _authorization(scope: Scope) -> str | None:
    """The Authorization header, read from the raw headers: `request.headers` builds Litestar's
    whole header mapping, a part of every stream's set-up (docs/bench-streams.md)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


@post("/v1/chat/completions", status_code=200, operation_class=ChatCompletionOperation)
async def chat_completions(request: Request[Any, Any, Any]) -> ASGIApp:
    runtime = runtime_of(request)
    principal = await runtime.keys.authenticate(_authorization(request.scope))
    req = parse_chat_request(await request.body())
    generation = await runtime.models.pipeline_for(principal.tier, req.model).admit(principal, req)
    if req.stream:
        return EventStreamResponse(generation)
    try:
        body = await until_disconnect(request.receive, generation.complete)
    finally:
        await generation.close()
    if body is None:  # the client left; nobody reads this
        return ASGIResponse(body=b"", status_code=499)
    return json_response(body, headers=generation.headers)
