"""A request the edge's exit cuts before any text, once it reached a replica, costs nothing, and
ends as the drain's cut of it does.

A plain stop (no drain), or a request still running past the drain deadline and its grace, is
cancelled by uvicorn's shutdown: a stream ends with the drain's error event (`server_shutting_down`,
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
import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from edge.keys.cli_support import opened_usage
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.live_server import LiveServer, start_server
from tests.support.scripted_replicas import scripted_replicas

HANG = 7  # the max_tokens of the request the replica takes and never answers
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": HANG}


def _hanging_server(tmp_path: Path, reached: threading.Event) -> LiveServer:
    """An edge whose replica takes a HANG request and never answers it (`reached` set then)."""

    async def hanging(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
        if req.max_new_tokens == HANG:
            reached.set()  # on the replica: its relay asked for the first token
            await asyncio.Event().wait()  # its prefill never ends; the exit cancels it
        async for delta in inner.generate(req):
            yield delta

    return start_server(tmp_path, None, scripted_replicas(hanging))


def _usage_rows(server: LiveServer) -> list[Any]:
    async def rows() -> list[Any]:
        async with opened_usage(server.settings, creates=False) as store:
            return list(await store.query("paid-user", "", ""))

    return asyncio.run(rows())


def _finished(reason: str) -> float:
    """floodgate_requests_finished_total of the paid tier for `reason` (the process's registry: the
    edge's ops listener is closed once it has exited)."""
    labels = {"model": "", "reason": reason, "tier": "paid"}
    return REGISTRY.get_sample_value("floodgate_requests_finished_total", labels) or 0.0


def _streamed_and_cut(tmp_path: Path) -> tuple[LiveServer, list[Any]]:
    """A stream the exit cuts on its replica before any text: its events."""
    reached = threading.Event()
    server = _hanging_server(tmp_path, reached)
    with (
        server,
        httpx.Client(base_url=server.base_url, timeout=60.0) as client,
        client.stream("POST", CHAT, json=BODY | {"stream": True}, headers=server.auth("paid")) as response,
    ):
        assert response.status_code == 200, response.read()
        stream = events(response)
        got = [next(stream)]  # the first event: admitted, its request sent to the replica
        assert reached.wait(60), "the request never reached the replica"
        # No drain: uvicorn's shutdown cancels the stream after its graceful timeout; the stream's
        # last events wait in the socket's buffer meanwhile.
        server.stop()
        got += list(stream)
    return server, got


def test_a_stream_the_exit_cuts_before_any_text_is_refunded_whole(tmp_path: Path) -> None:
    server, got = _streamed_and_cut(tmp_path)
    assert got[-1] == DONE
    assert got[-2]["error"]["code"] == "server_shutting_down"
    assert not any(
        c["delta"].get("content") for e in got if isinstance(e, dict) for c in e.get("choices", [])
    )
    # Refunded whole, as the drain's cut of it is: no request and no prompt token charged.
    assert _usage_rows(server) == []


def test_a_stream_the_exit_cuts_is_logged_as_the_drains_cut_not_as_a_hang_up(tmp_path: Path) -> None:
    """Its line and its count said `disconnected`, the client's doing: an operator could not tell
    an edge's exit from users leaving. They say what the client got, the drain's cut."""
    drained, disconnected = _finished("drained"), _finished("disconnected")
    with capture_logs() as logs:
        _, got = _streamed_and_cut(tmp_path)
    assert got[-2]["error"]["code"] == "server_shutting_down"
    (line,) = [line for line in logs if line["event"] == "chat_completion"]
    assert line["outcome"] == "drained" and line["error"] == "server_shutting_down", line
    assert line["prompt_tokens"] == 0, line
    assert _finished("drained") == drained + 1
    assert _finished("disconnected") == disconnected


def test_a_request_not_streamed_the_exit_cuts_gets_the_drains_503_and_costs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It got uvicorn's bare `500 Internal Server Error` (text, no Retry-After, a traceback in the
    log), was logged a 499 `disconnected`, and was charged its prompt and the request: a client
    retrying it paid twice. It gets the drain's 503 now, refunded whole as a stream cut so is."""
    reached = threading.Event()
    server = _hanging_server(tmp_path, reached)
    answer: list[httpx.Response] = []
    with capture_logs() as logs, server, httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        sender = threading.Thread(
            target=lambda: answer.append(client.post(CHAT, json=BODY, headers=server.auth("paid")))
        )
        sender.start()
        assert reached.wait(60), "the request never reached the replica"
        server.stop()  # no drain: uvicorn's shutdown cancels the request after its graceful timeout
        sender.join(60)
    (response,) = answer
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "server_shutting_down", response.text
    assert response.headers["retry-after"] == "1", response.headers
    (line,) = [line for line in logs if line["event"] == "chat_completion"]
    assert line["outcome"] == "drained" and line["status"] == 503, line
    assert line["prompt_tokens"] == 0, line
    assert "Exception in ASGI application" not in caplog.text
    assert _usage_rows(server) == []
