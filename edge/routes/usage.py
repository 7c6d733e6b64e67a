"""GET /v1/usage: the caller's own tokens per model and UTC day (`?start=YYYY-MM-DD&end=...`)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.params import FromQuery
from litestar.response.base import ASGIResponse

from edge.errors import invalid_request
from edge.keys.authorization_header import authorization_header
from edge.routes.json_body import json_response
from edge.routes.single_query import refuse_repeated
from edge.runtime import Runtime, runtime_of
from edge.usage.day import checked_day


async def usage_response(runtime: Runtime, user: str | None, start: str, end: str) -> ASGIResponse:
    for name, day in (("start", start), ("end", end)):
        if day:
            try:
                checked_day(day)
            except ValueError as exc:
                raise invalid_request(f"{name} {exc}.", name) from None
    rows = await runtime.usage.query(user, start, end)
    return json_response({"object": "list", "data": [row.as_dict() for row in rows]})


@get("/v1/usage")
async def own_usage(
    request: Request[Any, Any, Any], start: FromQuery[str] = "", end: FromQuery[str] = ""
) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await runtime.keys.authenticate(authorization_header(request.scope))
    refuse_repeated(request, "start", "end")
    return await usage_response(runtime, principal.user, start, end)
