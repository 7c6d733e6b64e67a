"""Which listener serves which route: the public one (the load balancer's target) and the operator
one (`[server] ops_host:ops_port`, edge/server.py).

A route says where it answers in its `opt`: `OPERATOR_ONLY` (the metrics and the replicas' load: no
load balancer may route to them), `BOTH` (the health probes, and the admin API, which operators
reach from inside the VPC through the operator listener since the load balancer never routes it);
any other route is public only. The operator listener answered the whole app before: from the
groups allowed to scrape it, the chat API and the playground answered there too, past the WAF and
the load balancer's TLS. A route the listener does not serve is a 404, as one that does not exist,
whatever the method.

Read from the route handler the router chose (Litestar's middleware run after routing), so a path
spelled another way (`//metrics`, a trailing slash) cannot slip past a check on the raw path. Two
of Litestar's answers are not a handler of ours, and name no listener: its OPTIONS answer (a
handler it adds to every path) and its 405 for a method a path lacks (raised by the router, before
any middleware). Both go where the path's own methods go (`path_listeners`), or they told each
listener of the other's routes (an Allow header listing them), and OPTIONS answered 404 for the
health probes on the operator listener, which serves them."""

from __future__ import annotations

from typing import Any, cast

from litestar import Litestar
from litestar.exceptions import HTTPException, ImproperlyConfiguredException, NotFoundException
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from litestar.utils import normalize_path

OPERATOR_ONLY: dict[str, Any] = {"listener": "operator"}
BOTH: dict[str, Any] = {"listener": "both"}

# The key in the app's state of `path_listeners(app)` (set by create_app).
PATH_LISTENERS = "path_listeners"
# The key in the app's state of `head.path_allows(app)` (set by create_app).
PATH_ALLOWS = "path_allows"
_OPTIONS_ONLY = frozenset({"OPTIONS"})


def is_options_answer(handler: BaseRouteHandler) -> bool:
    """The handler is Litestar's own OPTIONS answer (the one it adds to every path)."""
    return isinstance(handler, HTTPRouteHandler) and handler.http_methods == _OPTIONS_ONLY


def served_here(route_listener: str | None, on_operator: bool) -> bool:
    if route_listener == "both":
        return True
    return on_operator == (route_listener == "operator")


def path_listeners(app: Litestar) -> dict[str, str | None]:
    """Each HTTP path's template (as the router writes it in the scope) and the listener its
    methods are served on. One per path, or ImproperlyConfiguredException: Litestar's 405 and
    OPTIONS answers list every method of a path, so a path split between listeners would name one
    listener's methods on the other."""
    listeners: dict[str, str | None] = {}
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        named = {
            handler.opt.get("listener")
            for handler in route.route_handlers
            if handler.http_methods != _OPTIONS_ONLY
        }
        if len(named) > 1:
            raise ImproperlyConfiguredException(
                f"{route.path}: its methods name different listeners ({sorted(map(str, named))})"
            )
        listeners[route.path_format] = named.pop() if named else None
    return listeners


def on_operator_listener(scope: Scope) -> bool:
    """The request came in on the operator listener (`app.state.ops_port`, set by edge/server.py)."""
    ops_port = scope["app"].state.get("ops_port")
    server = scope.get("server")
    return ops_port is not None and server is not None and server[1] == ops_port


def listener_split(app: ASGIApp) -> ASGIApp:
    """The Litestar middleware factory (`Litestar(middleware=[listener_split, ...])`, first)."""

    async def split(scope: Scope, receive: Receive, send: Send) -> None:
        # Litestar runs route middleware for the routes' own scopes only (HTTP here), never lifespan.
        handler = cast(HTTPRouteHandler, scope["route_handler"])
        if is_options_answer(handler):
            # Litestar's own OPTIONS answer, whose opt names no listener (or its router's).
            state = scope["app"].state
            listener = state[PATH_LISTENERS].get(scope["path_template"])
            if not served_here(listener, on_operator_listener(scope)):
                raise NotFoundException()
            await app(scope, receive, _with_allow(send, state[PATH_ALLOWS].get(scope["path_template"])))
            return
        if not served_here(handler.opt.get("listener"), on_operator_listener(scope)):
            raise NotFoundException()
        await app(scope, receive, send)

    return split


def _with_allow(send: Send, allow: bytes | None) -> Send:
    """Litestar's OPTIONS answer with the path's whole Allow header (edge/routes/head.py)."""
    if allow is None:
        return send

    async def send_allow(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
            message = {**message, "headers": [*headers, (b"allow", allow)]}
        await send(message)

    return send_allow


def as_served_here(scope: Scope, exc: HTTPException) -> HTTPException:
    """The router's 405 for a path this listener does not serve: the 404 of an unknown path, with
    no Allow header naming the other listener's methods. Anything else as it is."""
    if exc.status_code != 405:
        return exc
    app: Litestar = scope["app"]
    try:
        # Every HTTP path has an OPTIONS handler (Litestar adds one), so this finds its template.
        *_, template = app.asgi_router.handle_routing(path=normalize_path(scope["path"]), method="OPTIONS")
    except HTTPException:
        return NotFoundException()
    if served_here(app.state[PATH_LISTENERS].get(template), on_operator_listener(scope)):
        return exc
    return NotFoundException()
