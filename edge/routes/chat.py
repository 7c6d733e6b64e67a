"""POST /v1/chat/completions: streaming (SSE) or one JSON answer.

Every call is answered by `answer_chat`. Litestar's route handler below declares the endpoint
(its OpenAPI operation, its place in the router) and serves it where the route takes Litestar's
own path; a served app takes the lean one (edge/routes/chat_route.py).
"""

from __future__ import annotations

from typing import Any, cast

from litestar import Request, post
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Receive, Scope

from edge.cancel.scope import cancel_scope
from edge.disconnect_watch import DISCONNECT_WATCH, DisconnectWatch
from edge.errors import REQUEST_MODEL, REQUEST_TIER, REQUEST_USER
from edge.openapi import ChatCompletionOperation
from edge.retry_count import is_retry
from edge.routes.json_body import json_response
from edge.routes.request_body import authorization_and_length, read_body
from edge.runtime import Runtime, runtime_of
from edge.schemas import parse_chat_request
from edge.stream_gate import NO_RESERVE, PLACE_OWNER
from edge.streaming import EventStreamResponse, until_disconnect


async def answer_chat(runtime: Runtime, scope: Scope, receive: Receive, max_bytes: int | None) -> ASGIApp:
    """The answer to one chat completion request: its response, or an ApiError / HTTPException
    raised for the app's exception handlers (edge/errors.py) to answer."""
    authorization, declared_length = authorization_and_length(scope)
    principal = await runtime.keys.authenticate(authorization)
    scope[REQUEST_USER] = principal.user  # type: ignore[literal-required]  # a refusal's log line
    tier = runtime.settings.tiers.get(principal.tier)
    if tier is not None:
        scope[REQUEST_TIER] = principal.tier  # type: ignore[literal-required]  # a refusal's count
    if tier is not None and not tier.may_use_reserve:
        # Before the body: the stream gate counts no place past the free share for it.
        scope[NO_RESERVE] = True  # type: ignore[literal-required]
    if tier is not None:
        # Before the body: the stream gate counts no more places for the user than it may run streams.
        scope[PLACE_OWNER] = (principal.user, tier.max_concurrent)  # type: ignore[literal-required]
    req = parse_chat_request(await read_body(receive, declared_length, max_bytes))
    pipeline = runtime.models.pipeline_for(principal.tier, req.model or "")
    if tier is not None:
        # The model a refusal from here on is counted under (floodgate_requests_rejected_total). An
        # unconfigured tier reaches none (the default pipeline only answers its 403 unknown_tier):
        # counted under that model, its refusals rose with requests none of its users sent.
        scope[REQUEST_MODEL] = pipeline.dispatcher.model  # type: ignore[literal-required]
    generation = await pipeline.admit(
        principal, req, cast(DisconnectWatch | None, scope.get(DISCONNECT_WATCH)), retry=is_retry(scope)
    )
    if req.stream:
        return EventStreamResponse(generation)
    # A hang-up cancels `cut`; the server's exit (uvicorn's shutdown, past its graceful timeout)
    # cancels the request's task itself, which leaves `cut` alone.
    cut = cancel_scope()
    try:
        body = await until_disconnect(
            scope, receive, lambda: generation.complete(lambda: not cut.cancel_called), cut
        )
    finally:
        await generation.close()
    if body is None:  # the client left; nobody reads this
        return ASGIResponse(body=b"", status_code=499)
    return json_response(body, headers=generation.headers)


@post("/v1/chat/completions", status_code=200, operation_class=ChatCompletionOperation)
async def chat_completions(request: Request[Any, Any, Any]) -> ASGIApp:
    max_bytes = request.route_handler.resolve_request_max_body_size()
    return await answer_chat(runtime_of(request), request.scope, request.receive, max_bytes)
