"""What the edge's dispatcher thinks of its replicas, read from the running app (same process)."""

from __future__ import annotations

from tests.support.live_server import LiveServer


def out_of_rotation(server: LiveServer) -> list[str]:
    """Replicas that may not be sent new work now: suspect after a failed generation (until their
    next health check passes), or failing their health checks."""
    states = server.app.state.runtime.pipeline.dispatcher.replica_states()
    return [state.name for state in states if not state.placeable]
