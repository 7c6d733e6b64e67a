"""POST /v1/chat/completions: streaming (SSE) or one JSON answer."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp

from edge.openapi import ChatCompletionOperation
from edge.routes.json_body import json_response
from edge.routes.request_body import authorization_and_length, read_body
from edge.runtime import runtime_of
from edge.schemas import parse_chat_request
from edge.streaming import EventStreamResponse, until_disconnect


@post("/v1/chat/completions", status_code=200, operation_class=ChatCompletionOperation)
async def chat_completions(request: Request[Any, Any, Any]) -> ASGIApp:
    runtime = runtime_of(request)
    authorization, declared_length = authorization_and_length(request.scope)
    principal = await runtime.keys.authenticate(authorization)
    max_bytes = request.route_handler.resolve_request_max_body_size()
    req = parse_chat_request(await read_body(request.receive, declared_length, max_bytes))
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
