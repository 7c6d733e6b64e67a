"""The caller of a key-authenticated route: its key checked, its user named for the route's
refusals, and its tier for their count (floodgate_requests_rejected_total). A refusal's
`request_refused` line reads the user from the scope (edge/errors.py log_refusal); a route that
authenticated without naming it logged its 404s and 429s with user null, and an operator could not
tell whose client was looping (the chat route names it itself, on its raw ASGI path)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from edge.errors import REQUEST_TIER, REQUEST_USER
from edge.keys.authorization_header import authorization_header
from edge.keys.principal import Principal
from edge.runtime import Runtime


async def caller(runtime: Runtime, request: Request[Any, Any, Any]) -> Principal:
    principal = await runtime.keys.authenticate(authorization_header(request.scope))
    request.scope[REQUEST_USER] = principal.user  # type: ignore[literal-required]
    if principal.tier in runtime.settings.tiers:
        request.scope[REQUEST_TIER] = principal.tier  # type: ignore[literal-required]
    return principal
