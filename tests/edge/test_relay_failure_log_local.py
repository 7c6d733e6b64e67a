"""A relay that fails on the in-process engine's path logs `direct_relay_failed` with the request's id,
user and tier, as every line a request causes does (docs/deploy.md, Metrics and logs). The engine's
outputs reach their mailboxes in a loop callback the engine's reader schedules (gpu_container/engine/
mailbox.py), in a context of its own: the line named the request by id alone, no user or tier.

On an edge of its own: structlog's capture is process-wide."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import structlog
from structlog.testing import capture_logs

from edge.config import Settings
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from edge.upstreams.direct import DeltaSink
from edge.upstreams.local_pool import local_upstreams
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import start_server

BREAKS = 64  # max_tokens of the request whose relay fails


class _BreakingRelay:
    """The real in-process replica, whose relay fails for the request asking for BREAKS tokens: the
    edge's `offer` raises where the engine hands it a delta, as a bug in it would."""

    def __init__(self, inner: Upstream) -> None:
        self._inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate_direct(self, req: GenerationRequest, offer: DeltaSink) -> AsyncIterator[Delta]:
        sink = _broken if req.max_new_tokens == BREAKS else offer
        return self._inner.generate_direct(req, sink)  # type: ignore[attr-defined,no-any-return]


def _broken(delta: Delta) -> bool:
    raise RuntimeError("the relay broke")


def _breaking(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
    @asynccontextmanager
    async def replicas() -> AsyncIterator[list[Upstream]]:
        async with local_upstreams(settings, model_dir) as ups:
            yield [_BreakingRelay(up) for up in ups]

    return replicas()


def test_a_failed_relay_on_the_engines_path_names_the_request_and_its_caller(tmp_path: Path) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": BREAKS,
        "min_tokens": BREAKS,
        "ignore_eos": True,
    }
    with start_server(tmp_path, {}, _breaking) as edge:
        # The context the served edge merges into every line; capture_logs alone leaves it out.
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            answer = httpx.post(edge.base_url + CHAT, json=body, headers=edge.auth("paid"), timeout=60)
    assert answer.status_code == 502, answer.text
    failed = [line for line in logs if line["event"] == "direct_relay_failed"]
    assert failed, [line["event"] for line in logs]
    assert {line.get("request_id") for line in failed} == {answer.headers["x-request-id"]}, failed
    assert {(line.get("user"), line.get("tier")) for line in failed} == {("paid-user", "paid")}, failed
