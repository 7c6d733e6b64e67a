"""A stream the edge's exit cuts before any text, once it reached a replica, costs nothing.

A plain stop (no drain), or a stream still running past the drain deadline and its grace, is
cancelled by uvicorn's shutdown: the stream ends with the drain's error event (`server_shutting_down`,
edge/streaming.py), which invites a retry, and floodgate_client's auto_retry sends one (it came
before any text). The drain's own cut of such a stream refunds it whole; the exit's charged its
prompt and the request, so the user paid for the prompt twice.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from edge.keys.cli_support import opened_usage
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.live_server import start_server
from tests.support.scripted_replicas import scripted_replicas

HANG = 7  # the max_tokens of the request the replica takes and never answers


def test_a_stream_the_exit_cuts_before_any_text_is_refunded_whole(tmp_path: Path) -> None:
    reached = threading.Event()

    async def hanging(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
        if req.max_new_tokens == HANG:
            reached.set()  # on the replica: its relay asked for the first token
            await asyncio.Event().wait()  # its prefill never ends; the exit cancels it
        async for delta in inner.generate(req):
            yield delta

    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": HANG,
        "stream": True,
    }
    server = start_server(tmp_path, None, scripted_replicas(hanging))
    with (
        server,
        httpx.Client(base_url=server.base_url, timeout=60.0) as client,
        client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response,
    ):
        assert response.status_code == 200, response.read()
        stream = events(response)
        got = [next(stream)]  # the first event: admitted, its request sent to the replica
        assert reached.wait(60), "the request never reached the replica"
        # No drain: uvicorn's shutdown cancels the stream after its graceful timeout; the stream's
        # last events wait in the socket's buffer meanwhile.
        server.stop()
        got += list(stream)
    assert got[-1] == DONE
    assert got[-2]["error"]["code"] == "server_shutting_down"
    assert not any(
        c["delta"].get("content") for e in got if isinstance(e, dict) for c in e.get("choices", [])
    )

    async def rows() -> list[Any]:
        async with opened_usage(server.settings, creates=False) as store:
            return list(await store.query("paid-user", "", ""))

    # Refunded whole, as the drain's cut of it is: no request and no prompt token charged.
    assert asyncio.run(rows()) == []
