"""Drill: a Triton replica killed (SIGKILL, with its Python-backend stubs: the container dies).

* After the first token: the stream on it ends with an error event and [DONE], never a hang, and
  its slot is given back.
* Before the first token: requests the dispatcher still sends there fail over to the other replica
  (or, once its health poll noticed, go there at once); every request is answered in full.
Either way no slot is left held, and the surviving replica ends with every KV block free.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.upstreams.triton import triton_upstreams
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from gpu_container.triton.trtllm_metrics import parse_trtllm_metrics
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, events
from tests.support.live_server import LiveServer, demo_model_dir, start_server
from tests.support.triton_server import ENGINE_CONFIG, LocalTriton, local_triton

__all__ = ["local_triton"]

CONCURRENT = 6

# Within the edge's 2,048-token context (prompt + reply) on this replica.
KILLED_REPLY_TOKENS = 2000


def _spec(process: TritonProcess) -> str:
    return process.replica_spec


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill(process: TritonProcess) -> None:
    """SIGKILL the server and everything it started, as when its container dies."""
    for pid in [process.process.pid, *_descendants(process.process.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.process.wait(timeout=30)


@pytest.fixture
def doomed(tmp_path: Path) -> Iterator[TritonProcess]:
    """A tritonserver of this test's own, to kill."""
    repository = render_cpu_repository(tmp_path / "repository", demo_model_dir(), ENGINE_CONFIG)
    process = start_local_triton(repository)
    stubs = _descendants(process.process.pid)
    try:
        yield process
    finally:
        process.stop()
        for pid in stubs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _held(server: LiveServer) -> int:
    return sum(r.sequences_held for r in server.app.state.runtime.pipeline.dispatcher.replica_states())


def test_a_replica_killed_mid_stream_ends_it_with_an_error_event(
    tmp_path: Path, doomed: TritonProcess
) -> None:
    with start_server(tmp_path, {}, triton_upstreams(_spec(doomed))) as server:
        with httpx.Client(base_url=server.base_url, timeout=120.0) as client:
            # Past the end tokens and long: under load the test could read its third event after
            # a 1,000-token reply had all arrived (a full-suite run: it ended whole, no error).
            body = {
                "model": MODEL,
                "messages": LONG_PROMPT,
                "max_tokens": KILLED_REPLY_TOKENS,
                "ignore_eos": True,
            }
            with client.stream("POST", CHAT, json=body | {"stream": True}, headers=server.auth("paid")) as r:
                assert r.status_code == 200
                seen: list[Any] = []
                for item in events(r):
                    seen.append(item)
                    if len(seen) == 3:  # the role, then content: past the first token
                        _kill(doomed)
        data = [e for e in seen if not (isinstance(e, str) and e.startswith(":"))]
        assert data[-1] == DONE
        assert "error" in data[-2], data[-2]
        assert not any(c["choices"][0]["finish_reason"] for c in data[:-2] if c.get("choices"))
        assert _held(server) == 0


def test_a_replica_killed_before_the_first_token_fails_over(
    tmp_path: Path, doomed: TritonProcess, local_triton: LocalTriton
) -> None:
    spec = f"{_spec(doomed)},{local_triton.spec}"
    with start_server(tmp_path, {}, triton_upstreams(spec)) as server:
        _kill(doomed)  # the dispatcher learns it at its next health poll, or from a failed request
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

        def ask(_: int) -> httpx.Response:
            return httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=120)

        with ThreadPoolExecutor(CONCURRENT) as pool:
            answers = list(pool.map(ask, range(CONCURRENT)))
        assert [a.status_code for a in answers] == [200] * CONCURRENT
        assert all(a.json()["choices"][0]["finish_reason"] in ("stop", "length") for a in answers)
        assert _held(server) == 0

    deadline = time.monotonic() + 30
    while True:
        survivor = parse_trtllm_metrics(httpx.get(local_triton.process.metrics_url, timeout=10).text)
        if survivor.scheduled_requests == 0 and survivor.used_blocks == 0:
            break
        assert time.monotonic() < deadline, f"the surviving replica still holds work: {survivor}"
        time.sleep(0.05)
