"""GET /v1/conversations/{conversation_id}/messages: a user's stored turns of one conversation, a
page at a time, as OpenAI's list endpoints page: `limit`, the cursors `after` and `before` (message
ids), `order`; the list says `first_id`, `last_id` and `has_more`. Oldest first by default, so a
conversation shorter than a page reads in the order it was written."""

from __future__ import annotations

import re
from typing import Any

from litestar import Request, get
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import FromPath, FromQuery
from litestar.response.base import ASGIResponse

from edge.errors import ApiError, invalid_request, wait_text
from edge.messages.store import Order
from edge.openapi import with_query
from edge.routes.caller import caller
from edge.routes.list_page import list_page
from edge.routes.page_limit import limit_schema, page_limit
from edge.routes.single_query import refuse_repeated
from edge.routes.utf8_path import refuse_undecodable_path
from edge.runtime import runtime_of
from edge.schemas import MAX_CONVERSATION_ID, unknown_tier
from limiter.reads import read_headers

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# What edge/messages/ids.py makes: 26 characters of Crockford's base 32.
_MESSAGE_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
_CURSOR = Schema(type=OpenAPIType.STRING, pattern=f"^{_MESSAGE_ID.pattern}$")
_QUERY = {
    "limit": limit_schema(DEFAULT_LIMIT, MAX_LIMIT),
    "after": _CURSOR,
    "before": _CURSOR,
    "order": Schema(type=OpenAPIType.STRING, enum=["asc", "desc"], default="asc"),
}


def _order(value: str | None) -> Order:
    if value is None or value == "asc":
        return "asc"
    if value == "desc":
        return "desc"
    raise invalid_request(
        f"Invalid 'order': {value[:64]!r}. Supported values are: 'asc' and 'desc'.",
        "order",
        code="invalid_value",
    )


def _cursor(name: str, value: str | None) -> str | None:
    if value is not None and not _MESSAGE_ID.fullmatch(value):
        raise invalid_request(
            f"Invalid '{name}': {value[:64]!r} is not a message id (the `id` of a message this endpoint "
            "listed).",
            name,
            code="invalid_value",
        )
    return value


@get("/v1/conversations/{conversation_id:str}/messages", operation_class=with_query(_QUERY))
async def conversation_messages(
    request: Request[Any, Any, Any],
    conversation_id: FromPath[str],
    limit: FromQuery[str | None] = None,
    after: FromQuery[str | None] = None,
    before: FromQuery[str | None] = None,
    order: FromQuery[str | None] = None,
) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await caller(runtime, request)
    refuse_undecodable_path(request.scope, "conversation_id")
    refuse_repeated(request, "limit", "after", "before", "order")
    size = page_limit(limit, DEFAULT_LIMIT, MAX_LIMIT)
    sort = _order(order)
    after, before = _cursor("after", after), _cursor("before", before)
    user = principal.user
    # Each read is a store read: limited in a budget of its own, never the chat completions'.
    tier = runtime.settings.tiers.get(principal.tier)
    if tier is None:
        raise unknown_tier(principal.tier)
    read = await runtime.history_reads.take_read(user, tier)
    headers = read_headers(read)
    if not read.allowed:
        wait = wait_text(read.retry_after_ms / 1000)
        raise ApiError(
            429,
            f"Rate limit reached (history reads). Please try again in {wait}.",
            type="requests",
            code="rate_limit_exceeded",
            headers=headers,
        )
    # Read-your-writes on this edge: the turns it has queued for this conversation (the reply of
    # a stream that just ended) are written first, so a client reloading the history when its
    # reply ends finds it there.
    await runtime.message_writer.written(conversation_id, user, runtime.settings.messages.read_wait_s)
    store = runtime.messages
    page = await store.history(conversation_id, user, size, after=after, before=before, order=sort)
    # An empty page past either end of a conversation that exists is a page like any other;
    # otherwise someone else's conversation looks exactly like a missing one. The id in the path
    # is of any length the request line allows: cut as every echo of user input is, at the
    # longest a conversation's id may be, so a real one is never cut.
    if not page.messages and (
        (after is None and before is None) or not (await store.history(conversation_id, user, 1)).messages
    ):
        raise ApiError(
            404,
            f"No conversation {conversation_id[:MAX_CONVERSATION_ID]}.",
            param="conversation_id",
            code="not_found",
            headers=headers,
        )
    data = [
        {
            "id": m.message_id,
            "role": m.role,
            "name": m.name,
            "model": m.model,
            "content": m.content,
            "created_at": m.created_at,
            "request_id": m.request_id,
            "finish_reason": m.finish_reason,
            "truncated": m.truncated,
        }
        for m in page.messages
    ]
    return list_page(data, page.has_more, headers, conversation_id=conversation_id)
