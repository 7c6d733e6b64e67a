"""HEAD wherever GET is served (RFC 9110 9.1: a general-purpose server supports both): GET's status
and headers, its content-length included, and no body.

Litestar answers a method only where a handler declares it, so every GET-only path (the models,
the metrics, the playground, the schema documents) answered HEAD with 405. Its router picks the
handler before any middleware runs, so a HEAD to a path with GET and no HEAD of its own is routed
here, before the router, as that path's GET: the same handler, guards and listener (a path the
listener does not serve stays a 404, edge/routes/listeners.py). The server leaves out the body:
uvicorn reads the method from its own scope, which stays HEAD (the app gets a copy).

A path with no GET keeps its 405, the chat route's included: a HEAD never reaches the stream gate,
the limiter or the conversation log. Declaring HEAD on each handler instead (as the health probes
do) would also list every GET twice in the OpenAPI document and rename the GET operations."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException, MethodNotAllowedException
from litestar.types import ASGIApp, Receive, Scope, Send
from litestar.utils import normalize_path


def _get_without_head(app: Litestar, path: str) -> bool:
    try:
        app.asgi_router.handle_routing(path=normalize_path(path), method="HEAD")
    except MethodNotAllowedException as exc:
        allowed = (exc.headers or {}).get("allow", "")
        return "GET" in (method.strip() for method in allowed.split(","))
    except HTTPException:
        return False  # an unknown path: its own 404 as it is
    return False  # a HEAD of its own


def answer_head_with_get(app: Litestar) -> None:
    """Runs before Litestar's router (wrapping the app's ASGI handler, after its own set-up of the
    scope); the rest of its requests pass as they are."""
    inner: ASGIApp = app.asgi_handler

    def head(scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # A plain function handing back the inner app's coroutine: no frame of its own on every
        # request's way (a set-up is issue 11's figure).
        if (
            scope["type"] == ScopeType.HTTP
            and scope["method"] == "HEAD"
            and _get_without_head(app, scope["path"])
        ):
            scope = cast(Scope, {**scope, "method": "GET"})
        return inner(scope, receive, send)

    app.asgi_handler = cast(ASGIApp, head)
