"""What the routes share for the life of the app, built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request

from edge.cancel.registry import RequestRegistry
from edge.config import Settings
from edge.keys.authenticator import Authenticator
from edge.keys.lifecycle import KeyLifecycle
from edge.messages.store import MessageStore
from edge.messages.writer import MessageWriter
from edge.models.catalog import ModelCatalog
from edge.pipeline import Pipeline
from edge.upstreams.base import Upstream
from edge.usage.store import UsageStore
from edge.usage.writer import UsageWriter
from limiter.reads import ReadLimit


@dataclass(slots=True)
class Runtime:
    settings: Settings
    keys: Authenticator
    pipeline: Pipeline
    registry: RequestRegistry
    upstreams: list[Upstream]
    messages: MessageStore
    # Read by the history route: it waits for this edge's own unwritten turns of a conversation.
    message_writer: MessageWriter
    key_admin: KeyLifecycle
    usage: UsageStore
    # Read by the usage routes: they wait for this edge's own unwritten usage of the user they read.
    usage_writer: UsageWriter
    # Every served model's pipeline; `pipeline` above is the first (the default).
    models: ModelCatalog
    # The history reads' own budget (limiter/reads.py), on the limiter the chat completions use.
    history_reads: ReadLimit


def runtime_of(request: Request[Any, Any, Any]) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime
