"""Drill: a client that opens a long stream over a socket with a tiny receive buffer and never reads.

The edge buffers at most what the connection's buffers hold (uvicorn's send waits once its
transport is full), and once one send has waited `stalled_reader_s` the stream is cut like a
disconnect: the replica drops the sequence and frees every KV block, the dispatcher's slot and the
limiter's lease are given back.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.edge.conftest import finished_requests, idle_engine, wait_for_engine_to_drop
from tests.edge.sse_client import LONG_PROMPT, LONG_TOKENS, MODEL, find_long_seed, wait_until
from tests.faults.stalled_client import open_and_never_read
from tests.support.live_server import LiveServer, start_server


def _stalled_cut(server: LiveServer) -> float:
    match = re.search(r"^floodgate_stalled_readers_cut_total ([0-9.e+]+)$", server.metrics_text(), re.M)
    return float(match.group(1)) if match else 0.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, {"server": {"stalled_reader_s": 1.0, "send_buffer_bytes": 4096}}) as edge:
        yield edge


def test_a_reader_that_stalls_is_cut_and_its_sequence_freed(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        seed = find_long_seed(client, server.keys["paid"])
    disconnected = finished_requests(server, "disconnected")
    cut = _stalled_cut(server)
    before = idle_engine(server)
    body = {"model": MODEL, "messages": LONG_PROMPT, "seed": seed, "max_tokens": LONG_TOKENS, "stream": True}
    sock = open_and_never_read(server, body)
    try:
        # The client is still connected: only the stall watch can have ended it.
        wait_until(
            lambda: finished_requests(server, "disconnected") == disconnected + 1,
            60,
            "the stalled stream to be cut",
        )
        after = wait_for_engine_to_drop(server, before)
        assert after.used_blocks == 0 and after.running == 0
        assert _stalled_cut(server) == cut + 1
        held = server.app.state.runtime.pipeline.dispatcher.replica_states()
        assert all(r.sequences_held == 0 and r.kv_tokens_held == 0 for r in held)
    finally:
        sock.close()
