"""Drill: a client that opens a long stream over a socket with a tiny receive buffer and never reads.

The edge buffers at most what the connection's buffers hold (uvicorn's send waits once its
transport is full), and once one send has waited `stalled_reader_s` the stream is cut like a
disconnect: the replica drops the sequence and frees every KV block, the dispatcher's slot and the
limiter's lease are given back.
"""

from __future__ import annotations

import re
import time
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


def test_a_reader_slower_than_the_stream_but_steady_is_not_cut(server: LiveServer) -> None:
    """The watch timed one send's wait, and a send waits until the connection's buffer has drained
    from its high-water mark (64 KiB) to its low one: a client reading steadily, only slower than
    the replica generates (a phone on a slow link), took longer than `stalled_reader_s` to read
    those 48 KiB and was cut as if it had stopped. Here it reads 1 KiB every 50 ms (about 20 KB/s,
    2.4 s for the 48 KiB against a 1 s limit) to the end of a reply of some 100 KB."""
    cut = _stalled_cut(server)
    body = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 600, "ignore_eos": True, "stream": True}
    sock = open_and_never_read(server, body)
    received = b""
    try:
        while not received.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(1024)
            if not chunk:
                break
            received += chunk
            time.sleep(0.05)  # the reader's pace, not a wait for the server
    finally:
        sock.close()
    assert received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), received[-200:]
    assert b'"finish_reason":"length"' in received
    assert _stalled_cut(server) == cut
