"""GET /healthz (the process answers) and GET /readyz (this instance should get traffic).

Both answer HEAD too, as uptime monitors and some load balancers probe: the status without the body.

Readiness reads the replica state the dispatcher keeps from its own health polls: it never calls a
replica itself, so hung replicas cannot make the load balancer's check time out. It fails while
the process drains (edge/drain.py), so the load balancer stops sending before the listener closes,
and while this edge joins the fleet (edge/membership/: share 0 until the others made room on the
replicas they share; not on replicas of its own, its local engines, which no other edge fills).

Only the operator listener says why (each replica's liveness, the fleet's view): the replicas'
names are their internal addresses, and the public listener answers whoever reaches it where no
load balancer filters it. The public answer is the status alone, with the same status code.
"""

from __future__ import annotations

from typing import Any

from litestar import HttpMethod, Request, route
from litestar.datastructures import State
from litestar.response.base import ASGIResponse

from edge.drain import Drain
from edge.membership.membership import FleetMembership
from edge.openapi import ProbeOperation
from edge.routes.json_body import json_response
from edge.routes.listeners import BOTH, on_operator_listener
from edge.runtime import Runtime

_PROBE_METHODS = [HttpMethod.GET, HttpMethod.HEAD]


def joining(state: State) -> bool:
    """This edge waits for the others to make room on the replicas they share (edge/membership/:
    its share is 0 until then). Not on replicas of its own only (its local engines), which no other
    edge fills. `serve --workers` holds a worker's public listener meanwhile (edge/server.py)."""
    fleet: FleetMembership | None = state.get("fleet")
    return fleet is not None and bool(state.get("fleet_divides")) and fleet.view.share == 0.0


@route("/healthz", http_method=_PROBE_METHODS, opt=BOTH, operation_class=ProbeOperation)
async def healthz() -> ASGIResponse:
    return json_response({"status": "ok"})


@route("/readyz", http_method=_PROBE_METHODS, opt=BOTH, operation_class=ProbeOperation)
async def readyz(request: Request[Any, Any, Any]) -> ASGIResponse:
    status, detail = _readiness(request.app.state)
    code = 200 if status == "ready" else 503
    if not on_operator_listener(request.scope):
        # The replicas' names are their internal addresses (host:port) and the fleet's view its
        # size: the public listener answers anyone a load balancer does not filter, so it says
        # only whether to send traffic. The operator listener keeps the detail.
        return json_response({"status": status}, status_code=code)
    return json_response({"status": status, **detail}, status_code=code)


def _readiness(state: State) -> tuple[str, dict[str, Any]]:
    """The status (`ready` or why not) and what it was read from: the replicas' liveness, the
    replicas of each model, and, with `[fleet]`, this edge's view of it."""
    if "runtime" not in state:
        return "starting", {"replicas": {}, "models": {}}
    runtime: Runtime = state.runtime
    states = runtime.models.replica_states()
    replicas = {r.name: r.alive for r in states}
    # Which model each replica serves: a remote Triton replica's name is only its address.
    models: dict[str, list[str]] = {}
    for r in states:
        models.setdefault(r.model, []).append(r.name)
    detail: dict[str, Any] = {"replicas": replicas, "models": models}
    drain: Drain = state.drain
    if drain.draining:
        return "draining", detail
    fleet: FleetMembership | None = state.get("fleet")
    if fleet is not None:
        view = fleet.view
        detail["fleet"] = {"live": view.live, "share": view.share, "source": view.source}
        if joining(state):
            return "joining", detail
    return ("ready" if any(replicas.values()) else "unavailable"), detail
