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
from pathlib import Path

import httpx

from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.edge.sse_client import CHAT
from tests.faults.test_failed_requests_cost_nothing import FAIL_AFTER_3, SHORT, _failing_replicas
from tests.support.live_server import start_server
from tests.support.scripted_replicas import scripted_replicas

HANG = 7


async def _hanging(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    """A generation asking for HANG tokens never yields its first (a long prefill)."""
    if req.max_new_tokens == HANG:
        await asyncio.Event().wait()
    async for delta in inner.generate(req):
        yield delta


_hanging_replicas = scripted_replicas(_hanging)


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
