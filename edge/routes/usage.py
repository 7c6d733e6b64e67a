"""GET /v1/usage: the caller's own tokens per model and UTC day (`?start=YYYY-MM-DD&end=...`), a
page at a time as OpenAI's lists page (`limit`, `after`: the previous page's `last_id`). All at once
it was one unbounded answer, and /v1/admin/usage a read of the whole table."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.openapi.spec import OpenAPIFormat, OpenAPIType, Schema
from litestar.params import FromQuery
from litestar.response.base import ASGIResponse

from edge.errors import ApiError, invalid_request
from edge.openapi import with_query
from edge.routes.caller import caller
from edge.routes.list_page import list_page
from edge.routes.page_limit import limit_schema, page_limit
from edge.routes.single_query import refuse_repeated
from edge.runtime import Runtime, runtime_of
from edge.usage.day import checked_day
from edge.usage.page import (
    DEFAULT_LIMIT,
    MAX_ID_CHARS,
    MAX_LIMIT,
    PREFIX,
    BadCursor,
    Position,
    position,
    row_id,
)

# A `start` or `end`: a day (checked_day), or empty for no bound.
DAY_BOUND = Schema(
    any_of=[
        Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.DATE),
        Schema(type=OpenAPIType.STRING, max_length=0),
    ]
)
USAGE_QUERY = {
    "start": DAY_BOUND,
    "end": DAY_BOUND,
    "limit": limit_schema(DEFAULT_LIMIT, MAX_LIMIT),
    # A row id is opaque: what can be said of it without decoding it.
    "after": Schema(type=OpenAPIType.STRING, pattern=f"^{PREFIX}", max_length=MAX_ID_CHARS),
}


def _bad_cursor(value: str) -> ApiError:
    return invalid_request(
        f"Invalid 'after': {value[:64]!r} is not a usage row id (the `id` of a row this endpoint listed).",
        "after",
        code="invalid_value",
    )


def _cursor(value: str | None) -> Position | None:
    if value is None:
        return None
    try:
        return position(value)
    except ValueError:
        raise _bad_cursor(value) from None


async def usage_response(
    runtime: Runtime, user: str | None, start: str, end: str, limit: str | None, after: str | None
) -> ASGIResponse:
    for name, day in (("start", start), ("end", end)):
        if day:
            try:
                checked_day(day)
            except ValueError as exc:
                raise invalid_request(f"{name} {exc}.", name) from None
    if start and end and start > end:
        # Swapped bounds name no day: answered as an empty list, they read as no usage at all (the
        # CLI's `floodgate usage` refuses them for the same reason, edge/keys_cli.py).
        raise invalid_request(f"start {start} is after end {end}.", "start", code="invalid_value")
    size = page_limit(limit, DEFAULT_LIMIT, MAX_LIMIT)
    # Before the wait below: a malformed cursor is refused at once, not after the writer has been
    # hurried (and waited for) on behalf of a read that reads nothing.
    cursor = _cursor(after)
    # Read-your-writes on this edge: the usage it has queued for this user (everyone's, for the
    # admin's read) is written first, so a request that just ended is counted.
    await runtime.usage_writer.written(user, runtime.settings.keys.usage_read_wait_s)
    try:
        page = await runtime.usage.page(user, start, end, cursor, size)
    except BadCursor:
        raise _bad_cursor(after or "") from None
    data = [{"id": row_id(row), **row.as_dict()} for row in page.rows]
    return list_page(data, page.has_more)


@get("/v1/usage", operation_class=with_query(USAGE_QUERY))
async def own_usage(
    request: Request[Any, Any, Any],
    start: FromQuery[str] = "",
    end: FromQuery[str] = "",
    limit: FromQuery[str | None] = None,
    after: FromQuery[str | None] = None,
) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await caller(runtime, request)
    refuse_repeated(request, "start", "end", "limit", "after")
    return await usage_response(runtime, principal.user, start, end, limit, after)
