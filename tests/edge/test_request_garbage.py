"""A finished request leaves nothing for the garbage collector: its server-side objects are freed
by reference counting the moment it ends.

Why it matters: the edge spaces its collections out (edge/gc_tuning.py), so garbage that only the
collector frees piles up, and the collection that finally frees it walks all of it while every open
stream waits: a request's cycle, scope and headers caught in a reference cycle (26 objects) made
one young collection of about 16 ms every ~1,000 streams, the longest TTFT in
`bench.ttft_overhead` (docs/bench-streams.md, thirteenth pass)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from edge.body_chunks import BodyChunkWriter
from edge.disconnect_watch import DisconnectWatch
from tests.edge.conftest import EDGE_SETTINGS
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.live_server import LiveServer, start_server

REQUEST_TYPES = (RequestResponseCycle, BodyChunkWriter, DisconnectWatch)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, EDGE_SETTINGS) as live:
        yield live


def _requests(server: LiveServer) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=server.base_url, timeout=30.0, headers=server.auth("paid")) as client:
        for _ in range(3):
            with client.stream("POST", CHAT, json=body | {"stream": True}) as response:
                assert list(events(response))[-1] == DONE
            assert client.post(CHAT, json=body).status_code == 200
        assert client.post(CHAT, json={"model": MODEL}).status_code in (400, 422)
        with client.stream("POST", CHAT, json=body | {"stream": True, "max_tokens": 64}) as response:
            stream = events(response)
            rid = next(stream)["request_id"]
            assert client.post(f"{CHAT}/{rid}/cancel").status_code in (200, 409)
            assert list(stream)[-1] == DONE
        # A client that leaves mid-stream.
        with client.stream("POST", CHAT, json=body | {"stream": True, "max_tokens": 64}) as response:
            next(events(response))


def _open_streams(server: LiveServer) -> float:
    (line,) = (
        line for line in server.metrics_text().splitlines() if line.startswith("floodgate_open_streams ")
    )
    return float(line.split()[1])


def test_finished_requests_leave_no_reference_cycles(server: LiveServer) -> None:
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage, not freed
    try:
        _requests(server)
        # The client has every response; the server's request tasks end right after.
        deadline = time.monotonic() + 10
        while (open_streams := _open_streams(server)) and time.monotonic() < deadline:
            time.sleep(0.01)
        gc.collect()
        leaked = [type(o).__name__ for o in gc.garbage if isinstance(o, REQUEST_TYPES)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert open_streams == 0
    assert leaked == []
