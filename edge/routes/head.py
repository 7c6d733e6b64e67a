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
do) would also list every GET twice in the OpenAPI document and rename the GET operations.

Litestar's Allow headers (its OPTIONS answer, its 405) list the handlers' methods, so they name
HEAD here too (RFC 9110 15.5.6, 9.3.7): they told clients HEAD was not supported where it is."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException, MethodNotAllowedException
from litestar.routes import HTTPRoute
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


def allow_with_head(allow: str) -> str:
    """A 405's Allow header (the router's, naming the path's handlers) with HEAD after GET."""
    methods = [method.strip() for method in allow.split(",")]
    if "GET" in methods and "HEAD" not in methods:
        methods.insert(methods.index("GET") + 1, "HEAD")
    return ", ".join(methods)


def path_allows(app: Litestar) -> dict[str, bytes]:
    """Each HTTP path's template (as the router writes it in the scope) and the Allow header its
    OPTIONS answer gives: every method of the path, HEAD among them where GET is. Litestar's own
    answer names the methods of the route it was made for, which leaves out the HEAD answered here,
    and where a path's handlers make several routes (the admin API's GET and POST /keys) names one
    route's methods only (litestar-org/litestar#4169)."""
    methods: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            methods.setdefault(route.path_format, set()).update(route.methods)
    for path_methods in methods.values():
        if "GET" in path_methods:
            path_methods.add("HEAD")
    return {path: ", ".join(sorted(path_methods)).encode() for path, path_methods in methods.items()}


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
