"""What the routes share for the life of the app, built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request

from edge.auth import KeyStore
from edge.cancel import RequestRegistry
from edge.config import Settings
from edge.messages.store import MessageStore
from edge.pipeline import Pipeline
from edge.upstreams.base import Upstream


@dataclass(slots=True)
class Runtime:
    settings: Settings
    keys: KeyStore
    pipeline: Pipeline
    registry: RequestRegistry
    upstreams: list[Upstream]
    messages: MessageStore


def runtime_of(request: Request[Any, Any, Any]) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime
