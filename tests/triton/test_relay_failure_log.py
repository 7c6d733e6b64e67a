"""A relay that fails on the Triton path logs `direct_relay_failed` with the request's id, as every
line a request causes does (docs/deploy.md, Metrics and logs). The relay runs in a loop callback
in a context of its own (edge/upstreams/triton_sse.py `_RelayBatch`), where no request_id is
bound: its line named no request, and an operator could not tell whose stream it ended; then, with
the id alone, it named no user or tier, where every other line the request caused did.

The replica's answer is paced through a proxy (tests/support/paced_stream_proxy.py): the relay is
offered tokens only from a read that follows the reader's first delta and precedes the answer's end,
and a loaded machine read the whole answer at once, the relay never offered anything (a 200)."""

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
from tests.support.paced_stream_proxy import PacedStreamProxy, paced_stream_proxy
from tests.triton.conftest import LocalTriton

BREAKS = 64  # max_tokens of the request whose relay fails; long and past the end tokens


class _BreakingRelay:
    """The real Triton replica, whose relay fails for the request asking for BREAKS tokens: the
    edge's `offer` raises where the relay hands it a delta, as a bug in it would. It tells the
    proxy when the stream's reader waits for its second delta (the events may come: a read now
    goes to the relay), and when the relay was offered one (the answer may end)."""

    def __init__(self, inner: Upstream, proxy: PacedStreamProxy) -> None:
        self._inner = inner
        self._proxy = proxy
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate_direct(self, req: GenerationRequest, offer: DeltaSink) -> AsyncIterator[Delta]:
        if req.max_new_tokens != BREAKS:
            return self._inner.generate_direct(req, offer)  # type: ignore[attr-defined,no-any-return]
        proxy = self._proxy

        def breaking(delta: Delta) -> bool:
            proxy.relayed()
            raise RuntimeError("the relay broke")

        deltas: AsyncIterator[Delta] = self._inner.generate_direct(req, breaking)  # type: ignore[attr-defined]
        return self._paced(deltas, proxy)

    @staticmethod
    async def _paced(deltas: AsyncIterator[Delta], proxy: PacedStreamProxy) -> AsyncIterator[Delta]:
        try:
            async for delta in deltas:
                yield delta
                # Asked for the next delta: the reader goes back to its wait within this step of
                # the task, before the loop reads anything the proxy passes on from here.
                proxy.reader_waits()
        finally:
            # Closing the iterator aborts the replica's sequence (edge/upstreams/direct.py).
            await deltas.aclose()  # type: ignore[attr-defined]


@pytest.fixture
def proxy(local_triton: LocalTriton) -> Iterator[PacedStreamProxy]:
    _, http_port, _ = local_triton.spec.split(":")
    with paced_stream_proxy(int(http_port)) as proxy:
        yield proxy


@pytest.fixture
def server(tmp_path: Path, local_triton: LocalTriton, proxy: PacedStreamProxy) -> Iterator[LiveServer]:
    host, _, metrics_port = local_triton.spec.split(":")
    real = triton_upstreams(f"{host}:{proxy.port}:{metrics_port}")

    def provide(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
        @asynccontextmanager
        async def replicas() -> AsyncIterator[list[Upstream]]:
            async with real(settings, model_dir) as ups:
                yield [_BreakingRelay(up, proxy) for up in ups]

        return replicas()

    with start_server(tmp_path, {}, provide) as live:
        yield live


def test_a_failed_relay_on_the_triton_path_logs_the_requests_id(
    server: LiveServer, proxy: PacedStreamProxy
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": BREAKS,
        "min_tokens": BREAKS,
        "ignore_eos": True,
    }
    proxy.pace_next_stream()
    # The context the served edge merges into every line; capture_logs alone leaves it out.
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        answer = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=60)
    assert answer.status_code == 502, answer.text
    failed = [line for line in logs if line["event"] == "direct_relay_failed"]
    assert failed, [line["event"] for line in logs]
    assert {line.get("request_id") for line in failed} == {answer.headers["x-request-id"]}, failed
    # And whose request it was, as every other line the request caused says.
    assert {(line.get("user"), line.get("tier")) for line in failed} == {("paid-user", "paid")}, failed
