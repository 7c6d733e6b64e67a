"""A request the Triton replica refuses for its own parameters is a 400 for it alone (issue 13).

Regression: the CPU model's refusal reached the edge as a bare error string, the edge took it for a
failed replica (502 or an error event), marked the replica suspect and every user's time to first
token suffered. Here the replica's engine holds fewer tokens than the edge lets a prompt have, so
the engine itself refuses a long prompt, exactly as it refuses any bad parameter.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edge.upstreams.triton import triton_upstreams
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.live_server import LiveServer, demo_model_dir, start_server

# Fewer tokens than the edge allows a prompt (its own limit is the configured 2048).
SMALL_ENGINE = EngineConfig(block_size=16, num_blocks=64, max_num_seqs=8, max_model_len=48)
TOO_LONG = [{"role": "user", "content": "tell me a story " * 40}]


def _suspects(server: LiveServer) -> list[str]:
    """Replicas the dispatcher blames for a failed generation (out of rotation until their next
    health check). Read directly: a health check that times out on a loaded machine also takes a
    replica out of rotation, and is not what this test is about."""
    members = server.app.state.runtime.pipeline.dispatcher.replicas.members
    return [replica.name for replica in members if replica.suspect_since_check is not None]


@pytest.fixture(scope="module")
def small_triton() -> Iterator[TritonProcess]:
    with tempfile.TemporaryDirectory(prefix="small-cpu-repo-") as repo:
        process = start_local_triton(render_cpu_repository(Path(repo), demo_model_dir(), SMALL_ENGINE))
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, small_triton: TritonProcess) -> Iterator[LiveServer]:
    spec = small_triton.replica_spec
    with start_server(
        tmp_path_factory.mktemp("edge-small-triton"), {"tiers": ROOMY_TIERS}, triton_upstreams(spec)
    ) as live:
        yield live


def test_a_request_the_replica_refuses_is_a_400_and_the_replica_stays_healthy(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
        plain = client.post(CHAT, json={"model": MODEL, "messages": TOO_LONG, "max_tokens": 4})
        with client.stream(
            "POST", CHAT, json={"model": MODEL, "messages": TOO_LONG, "max_tokens": 4, "stream": True}
        ) as stream:
            streamed = list(events(stream))
        suspects = _suspects(server)
    # Another user's good requests right after: served at once by the same replica.
    # Its whole length, by count: the tiny random-weight model's first token may be its end token,
    # and a reply of it alone is empty (a full-suite run).
    hello = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("free")) as other:
        fine = other.post(CHAT, json=hello)
        streaming = {**hello, "stream": True, "stream_options": {"include_usage": True}}
        with other.stream("POST", CHAT, json=streaming) as stream:
            fine_streamed = list(events(stream))

    assert plain.status_code == 400, plain.text
    error = plain.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "refused" in error["message"] and "max_model_len is 48" in error["message"]
    errors = [e["error"] for e in streamed if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0]["type"] == "invalid_request_error"
    assert "max_model_len is 48" in errors[0]["message"]
    assert streamed[-1] == DONE
    assert suspects == []
    assert _suspects(server) == []
    assert fine.status_code == 200, fine.text
    assert fine.json()["usage"]["completion_tokens"] == 4
    chunks = [e for e in fine_streamed if isinstance(e, dict)]
    assert fine_streamed[-1] == DONE and not [e for e in chunks if "error" in e]
    assert chunks[-1]["usage"]["completion_tokens"] == 4
