"""What a request's end teaches the admission queue, on a real server: only a generation that ran
is a service time for its replica's rate and a reply length for its user's usual reply (what the
fair queue prices the user's next requests at; a first sample replaces the prior). A cancel before
the first token, and a replica that fails mid-stream, were given back as generations that ran (a
review): the user's usual reply was learnt as 0 or 3 tokens. A replica failing mid-stream is now
suspect, as one failing before its first token is."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from edge.config import Settings
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from edge.upstreams.local_pool import PrivateUpstreams, local_upstreams
from tests.edge.sse_client import CHAT
from tests.faults.test_failed_requests_cost_nothing import FAIL_AFTER_3, SHORT, _failing_replicas
from tests.support.live_server import start_server

HANG = 7


class _HangingReplica:
    """The real engine, but a generation asking for HANG tokens never yields its first (a long prefill)."""

    generate_direct = None

    def __init__(self, inner: Upstream) -> None:
        self._inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(req)

    async def _generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        if req.max_new_tokens == HANG:
            await asyncio.Event().wait()
        async for delta in self._inner.generate(req):
            yield delta


def _hanging_replicas(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
    @asynccontextmanager
    async def provide() -> AsyncIterator[list[Upstream]]:
        async with local_upstreams(settings, model_dir) as ups:
            yield PrivateUpstreams([_HangingReplica(up) for up in ups])

    return provide()


def test_a_cancel_before_the_first_token_teaches_no_reply_length(tmp_path: Path) -> None:
    """Cancelled while its replica had produced no token (a long prefill)."""
    with start_server(tmp_path, None, _hanging_replicas) as server:
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            with client.stream("POST", CHAT, json=SHORT | {"max_tokens": HANG, "stream": True}) as streamed:
                lines = streamed.iter_lines()
                first = next(line for line in lines if line.startswith("data: {"))
                request_id = json.loads(first.removeprefix("data: "))["id"]
                cancelled = client.post(f"{CHAT}/{request_id}/cancel")
                rest = list(lines)
        assert cancelled.status_code == 200, cancelled.text
        assert any('"cancelled"' in line for line in rest), rest
        learnt = (
            dict(dispatcher._reply_lengths._by_user),
            [r.rate.samples for r in dispatcher.replicas.members],
        )
        assert learnt == ({}, [0])


def test_a_replica_failing_mid_stream_teaches_no_reply_length(tmp_path: Path) -> None:
    """The replica fails after 3 of up to 9 tokens."""
    with start_server(tmp_path, None, _failing_replicas) as server:
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            failed = client.post(CHAT, json=SHORT | {"max_tokens": FAIL_AFTER_3})
        assert failed.status_code == 502, failed.text
        learnt = (
            dict(dispatcher._reply_lengths._by_user),
            [r.rate.samples for r in dispatcher.replicas.members],
        )
        assert learnt == ({}, [0])
