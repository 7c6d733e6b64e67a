"""What the edge's dispatcher thinks of its replicas, read from the running app (same process)."""

from __future__ import annotations

from typing import Any

from tests.support.live_server import LiveServer


def _dispatcher(server: LiveServer) -> Any:
    pipeline = server.app.state.runtime.pipeline
    # `slots` until the drain work renames it `dispatcher`.
    return getattr(pipeline, "dispatcher", None) or pipeline.slots


def suspect_replicas(server: LiveServer) -> list[str]:
    """Replicas that a failed generation took out of rotation until their next health check."""
    return [r.name for r in _dispatcher(server)._replicas if r.suspect_since_check is not None]
