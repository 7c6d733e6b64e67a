"""GET /healthz (the process answers) and GET /readyz (this instance should get traffic).

Both answer HEAD too, as uptime monitors and some load balancers probe: the status without the body.

Readiness reads the replica state the dispatcher keeps from its own health polls: it never calls a
replica itself, so hung replicas cannot make the load balancer's check time out. It fails while
the process drains (edge/drain.py), so the load balancer stops sending before the listener closes,
and while this edge joins the fleet (edge/membership/: share 0 until the others made room on the
replicas they share; not on replicas of its own, its local engines, which no other edge fills).
"""

from __future__ import annotations

from typing import Any

from litestar import HttpMethod, Request, route
from litestar.datastructures import State
from litestar.response.base import ASGIResponse

from edge.drain import Drain
from edge.membership.membership import FleetMembership
from edge.routes.json_body import json_response
from edge.routes.listeners import BOTH
from edge.runtime import runtime_of

_PROBE_METHODS = [HttpMethod.GET, HttpMethod.HEAD]


def joining(state: State) -> bool:
    """This edge waits for the others to make room on the replicas they share (edge/membership/:
    its share is 0 until then). Not on replicas of its own only (its local engines), which no other
    edge fills. `serve --workers` holds a worker's public listener meanwhile (edge/server.py)."""
    fleet: FleetMembership | None = state.get("fleet")
    return fleet is not None and bool(state.get("fleet_divides")) and fleet.view.share == 0.0


@route("/healthz", http_method=_PROBE_METHODS, opt=BOTH)
async def healthz() -> ASGIResponse:
    return json_response({"status": "ok"})


@route("/readyz", http_method=_PROBE_METHODS, opt=BOTH)
async def readyz(request: Request[Any, Any, Any]) -> ASGIResponse:
    state = request.app.state
    if "runtime" not in state:
        return json_response({"status": "starting", "replicas": {}}, status_code=503)
    replicas = {r.name: r.alive for r in runtime_of(request).models.replica_states()}
    drain: Drain = state.drain
    if drain.draining:
        return json_response({"status": "draining", "replicas": replicas}, status_code=503)
    fleet: FleetMembership | None = state.get("fleet")
    if fleet is not None:
        view = fleet.view
        body = {
            "replicas": replicas,
            "fleet": {"live": view.live, "share": view.share, "source": view.source},
        }
        if joining(state):
            return json_response({"status": "joining", **body}, status_code=503)
    else:
        body = {"replicas": replicas}
    ready = any(replicas.values())
    return json_response({"status": "ready" if ready else "unavailable", **body}, 200 if ready else 503)
