"""A relay that fails on the Triton path logs `direct_relay_failed` with the request's id, as every
line a request causes does (docs/deploy.md, Metrics and logs). The relay runs in a loop callback
in a context of its own (edge/upstreams/triton_sse.py `_RelayBatch`), where no request_id is
bound: its line named no request, and an operator could not tell whose stream it ended."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from structlog.testing import capture_logs

from edge.config import Settings
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from edge.upstreams.direct import DeltaSink
from edge.upstreams.triton import triton_upstreams
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer, start_server
from tests.triton.conftest import LocalTriton

BREAKS = 64  # max_tokens of the request whose relay fails; long and past the end tokens


class _BreakingRelay:
    """The real Triton replica, whose relay fails for the request asking for BREAKS tokens: the
    edge's `offer` raises where the relay hands it a delta, as a bug in it would."""

    def __init__(self, inner: Upstream) -> None:
        self._inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate_direct(self, req: GenerationRequest, offer: DeltaSink) -> AsyncIterator[Delta]:
        if req.max_new_tokens == BREAKS:

            def breaking(delta: Delta) -> bool:
                raise RuntimeError("the relay broke")

            offer = breaking
        return self._inner.generate_direct(req, offer)  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def server(tmp_path: Path, local_triton: LocalTriton) -> Iterator[LiveServer]:
    real = triton_upstreams(local_triton.spec)

    def provide(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
        @asynccontextmanager
        async def replicas() -> AsyncIterator[list[Upstream]]:
            async with real(settings, model_dir) as ups:
                yield [_BreakingRelay(up) for up in ups]

        return replicas()

    with start_server(tmp_path, {}, provide) as live:
        yield live


def test_a_failed_relay_on_the_triton_path_logs_the_requests_id(server: LiveServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": BREAKS,
        "min_tokens": BREAKS,
        "ignore_eos": True,
    }
    # The context the served edge merges into every line; capture_logs alone leaves it out.
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        answer = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=60)
    assert answer.status_code == 502, answer.text
    failed = [line for line in logs if line["event"] == "direct_relay_failed"]
    assert failed, [line["event"] for line in logs]
    assert {line.get("request_id") for line in failed} == {answer.headers["x-request-id"]}, failed
