"""Drill: a Triton replica told to stop (SIGTERM, as an instance's shutdown or a rolling deploy
sends it) while a stream runs on it.

tritonserver then drains its HTTP service: it closes every new connection without an answer, while
the connections already open go on as before, its readiness answering 200 there and new inferences
taken, until every connection is closed or its --exit-timeout-secs has passed, when it exits and
cuts whatever still runs. The edge asked for readiness on its kept-alive connections: it kept the
replica in rotation through the drain and sent it new requests, and its idle connections held the
drain open until the exit timeout (exit 1, the streams started meanwhile cut).

Now: the next health check takes the replica out (a new request with no other replica gets a 503
with Retry-After), the stream already running ends whole, and the edge lets its idle connections
go, so that tritonserver exits cleanly once that stream has ended.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.upstreams.triton import triton_upstreams
from gpu_container.triton import launcher
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, events
from tests.support.live_server import LiveServer, demo_model_dir, start_server
from tests.support.triton_server import ENGINE_CONFIG

# Far past the test's own bounds: the server exits by its drain ending, never by this timeout.
DRAIN_EXIT_TIMEOUT_S = 120
GUARD_S = 60.0
# Within the edge's 2,048-token context (prompt + reply) on this replica.
REPLY_TOKENS = 2000
# tritonserver's line for each second of its HTTP drain: printed once it refuses new connections.
DRAINING = "HTTP service connections"


@pytest.fixture
def stopping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TritonProcess]:
    """A tritonserver of this test's own, to SIGTERM, whose exit timeout outlasts the test."""
    monkeypatch.setattr(launcher, "EXIT_TIMEOUT_S", DRAIN_EXIT_TIMEOUT_S)
    repository = render_cpu_repository(tmp_path / "repository", demo_model_dir(), ENGINE_CONFIG)
    process = start_local_triton(repository)
    try:
        yield process
    finally:
        process.group.send_signal(signal.SIGKILL)  # a no-op once it has exited
        process.stop()


def _wait_draining(process: TritonProcess) -> None:
    deadline = time.monotonic() + GUARD_S
    while DRAINING not in process.log_path.read_text(errors="replace"):
        assert process.process.poll() is None, "tritonserver exited instead of draining"
        assert time.monotonic() < deadline, "tritonserver never began its drain"
        time.sleep(0.02)  # a child's log file: nothing to wait on but a poll


def _check_replicas(server: LiveServer) -> None:
    """A health check of every replica now, on the edge's loop (the poller's, without its wait)."""
    loop = server._server.loop
    assert loop is not None
    dispatcher = server.app.state.runtime.pipeline.dispatcher
    asyncio.run_coroutine_threadsafe(dispatcher.check_replicas(), loop).result(GUARD_S)


def test_a_draining_replica_is_taken_out_and_its_stream_ends_whole(
    tmp_path: Path, stopping: TritonProcess
) -> None:
    with start_server(tmp_path, {}, triton_upstreams(stopping.replica_spec)) as server:
        client = httpx.Client(base_url=server.base_url, timeout=GUARD_S)
        short = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        long = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": REPLY_TOKENS, "ignore_eos": True}
        started = threading.Event()
        seen: list[Any] = []

        def read_stream() -> None:
            with httpx.stream(
                "POST",
                server.base_url + CHAT,
                json=long | {"stream": True},
                headers=server.auth("paid"),
                timeout=GUARD_S,
            ) as r:
                for item in events(r):
                    seen.append(item)
                    if len(seen) == 2:  # the role, then content: the replica generates
                        started.set()
            started.set()

        reader = threading.Thread(target=read_stream)
        reader.start()
        try:
            assert started.wait(GUARD_S)
            # Served beside the stream: the edge holds an idle kept-alive connection to the
            # replica besides the stream's, as any edge that has served does.
            assert client.post(CHAT, json=short, headers=server.auth("paid")).status_code == 200
            stopping.process.send_signal(signal.SIGTERM)
            _wait_draining(stopping)
            _check_replicas(server)
            assert [s.alive for s in server.app.state.runtime.pipeline.dispatcher.replica_states()] == [False]
            # Not sent to the replica that is stopping: the answer for no replica, and when to retry.
            refused = client.post(CHAT, json=short, headers=server.auth("paid"))
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "no_replica"
            assert int(refused.headers["retry-after"]) >= 1
        finally:
            reader.join(GUARD_S)
            client.close()
        data = [e for e in seen if not (isinstance(e, str) and e.startswith(":"))]
        assert data[-1] == DONE
        finishes = [c["choices"][0]["finish_reason"] for c in data[:-1] if c.get("choices")]
        assert finishes[-1] == "length", data[-3:]
        # Its drain over once the stream had ended, with the edge still running: a clean exit.
        assert stopping.process.wait(timeout=GUARD_S) == 0
