"""Which listener serves which route: the public one (the load balancer's target) and the operator
one (`[server] ops_host:ops_port`, edge/server.py).

A route says where it answers in its `opt`: `OPERATOR_ONLY` (the metrics and the replicas' load: no
load balancer may route to them), `BOTH` (the health probes, and the admin API, which operators
reach from inside the VPC through the operator listener since the load balancer never routes it);
any other route is public only. The operator listener answered the whole app before: from the
groups allowed to scrape it, the chat API and the playground answered there too, past the WAF and
the load balancer's TLS. A route the listener does not serve is a 404, as one that does not exist.

Read from the route handler the router chose (Litestar's middleware run after routing), so a path
spelled another way (`//metrics`, a trailing slash) cannot slip past a check on the raw path."""

from __future__ import annotations

from typing import Any

from litestar.exceptions import NotFoundException
from litestar.types import ASGIApp, Receive, Scope, Send

OPERATOR_ONLY: dict[str, Any] = {"listener": "operator"}
BOTH: dict[str, Any] = {"listener": "both"}


def served_here(route_listener: str | None, on_operator_listener: bool) -> bool:
    if route_listener == "both":
        return True
    return on_operator_listener == (route_listener == "operator")


def listener_split(app: ASGIApp) -> ASGIApp:
    """The Litestar middleware factory (`Litestar(middleware=[listener_split, ...])`, first)."""

    async def split(scope: Scope, receive: Receive, send: Send) -> None:
        # Litestar runs route middleware for the routes' own scopes only (HTTP here), never lifespan.
        ops_port = scope["app"].state.get("ops_port")
        server = scope.get("server")
        on_operator = ops_port is not None and server is not None and server[1] == ops_port
        if not served_here(scope["route_handler"].opt.get("listener"), on_operator):
            raise NotFoundException()
        await app(scope, receive, send)

    return split
