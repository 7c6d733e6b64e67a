"""The chat completion route without Litestar's per-request handler machinery.

Every stream's set-up passed through Litestar's route-level exception middleware and its route's
`handle`: a `Request` object, the handler's keyword model and signature model, an exit stack, the
response handler; about a twentieth of a one-token stream's CPU (docs/bench-streams.md), for a
handler that takes only the raw scope and returns an ASGI app. This middleware, the innermost of
the app's, answers `POST /v1/chat/completions` with `answer_chat` itself and never calls that
machinery.

What stays the same: Litestar's router chose the route (its path normalisation, host check and
405 for other methods) and set the scope's app, route handler and exception handlers; the gate
and the body deadline run outside this, as before. An exception raised here passes the gate and
the body deadline to Litestar's app-level exception middleware, which answers it with the same
handlers the route-level one resolved (the router put them in the scope), through the same send:
the same status, body and headers, and the same "after the response started" rule.

A route handler with anything the machinery would have run (guards, dependencies, before/after
request or after response hooks, a response cache) is served the Litestar way instead.
"""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.handlers import HTTPRouteHandler
from litestar.types import ASGIApp, Receive, Scope, Send

from edge.routes.chat import answer_chat
from edge.stream_gate import GENERATION_PATH


def _plain(handler: HTTPRouteHandler) -> bool:
    """Nothing but the handler's own call happens between routing and the response."""
    return not (
        handler.resolve_guards()
        or handler.resolve_dependencies()
        or handler.resolve_before_request()
        or any(getattr(layer, "after_request", None) for layer in handler.ownership_layers)
        or handler.resolve_after_response()
        or handler.cache
    )


def chat_route(app: ASGIApp) -> ASGIApp:
    """The Litestar middleware factory (`Litestar(middleware=[..., chat_route])`, last: innermost)."""
    lean: bool | None = None  # whether the route's handler is plain; decided at its first request

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal lean
        chat = scope["type"] == ScopeType.HTTP and scope["path"] == GENERATION_PATH
        if not chat or scope.get("method") != "POST":
            await app(scope, receive, send)
            return
        handler = scope["route_handler"]
        if lean is None:
            lean = isinstance(handler, HTTPRouteHandler) and _plain(handler)
        if not lean or not isinstance(handler, HTTPRouteHandler):
            await app(scope, receive, send)
            return
        runtime = scope["app"].state.runtime
        response = await answer_chat(runtime, scope, receive, handler.resolve_request_max_body_size())
        await response(scope, receive, send)

    return route
