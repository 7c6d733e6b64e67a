"""GET /v1/conversations/{conversation_id}/messages: a user's stored turns of one conversation."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, get
from litestar.params import FromPath, Parameter
from litestar.response.base import ASGIResponse

from edge.errors import ApiError
from edge.routes.json_body import json_response
from edge.runtime import runtime_of


@get("/v1/conversations/{conversation_id:str}/messages")
async def conversation_messages(
    request: Request[Any, Any, Any],
    conversation_id: FromPath[str],
    limit: Annotated[int, Parameter(ge=1, le=1000)] = 100,
) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await runtime.keys.authenticate(request.headers.get("authorization"))
    messages = await runtime.messages.history(conversation_id, principal.user, limit)
    if not messages:
        # Someone else's conversation looks exactly like a missing one.
        raise ApiError(404, f"No conversation {conversation_id}.", param="conversation_id", code="not_found")
    data = [
        {
            "id": m.message_id,
            "role": m.role,
            "content": m.content,
            "created_at": m.created_at,
            "request_id": m.request_id,
            "finish_reason": m.finish_reason,
            "truncated": m.truncated,
        }
        for m in messages
    ]
    return json_response({"object": "list", "conversation_id": conversation_id, "data": data})
