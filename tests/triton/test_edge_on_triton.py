"""A chat completion through the real edge with Triton as its replica, against the same edge on the
in-process engine: same seeded answer, and a client that hangs up frees the Triton engine."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from edge.upstreams.triton import TrtLlmMetrics, parse_trtllm_metrics, triton_upstreams
from tests.support.live_server import LiveServer, start_server
from tests.triton.conftest import LocalTriton

CHAT = "/v1/chat/completions"
BODY = {
    "model": "floodgate-tiny",
    "messages": [{"role": "user", "content": "Tell me about rivers."}],
    "stream": True,
    "max_tokens": 24,
    "seed": 5,
    "stream_options": {"include_usage": True},
}
PAID = {
    "priority": 10,
    "requests_per_window": 1000,
    "request_window_s": 3600,
    "tokens_per_window": 10_000_000,
    "token_window_s": 3600,
    "max_concurrent": 8,
    "max_tokens": 2000,
    "max_queue_wait_s": 60.0,
    "on_store_failure": "open",
}


@pytest.fixture(scope="module")
def edge_on_triton(
    local_triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    process = local_triton.process
    metrics_port = process.metrics_url.rsplit(":", 1)[1].split("/")[0]
    provider = triton_upstreams(f"{process.grpc_url}:{metrics_port}")
    with start_server(tmp_path_factory.mktemp("edge-triton"), {"tiers": {"paid": PAID}}, provider) as server:
        yield server


@pytest.fixture(scope="module")
def edge_on_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("edge-engine"), {"tiers": {"paid": PAID}}) as server:
        yield server


def _stream(server: LiveServer, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    with httpx.Client(base_url=server.base_url, timeout=30.0) as client:
        with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: "):
                    data = line[len("data: ") :]
                    events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _answer(events: list[Any]) -> tuple[str, str | None, dict[str, int]]:
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    usage = next(e["usage"] for e in events if isinstance(e, dict) and e.get("usage"))
    return text, reasons[-1] if reasons else None, usage


def test_the_edge_answers_the_same_on_triton_as_on_the_engine(
    edge_on_triton: LiveServer, edge_on_engine: LiveServer
) -> None:
    on_triton = _stream(edge_on_triton, BODY)
    on_engine = _stream(edge_on_engine, BODY)
    assert on_triton[-1] == "[DONE]"
    text, reason, usage = _answer(on_triton)
    assert text
    assert (text, reason, usage) == _answer(on_engine)


def _metrics(url: str) -> TrtLlmMetrics:
    return parse_trtllm_metrics(httpx.get(url, timeout=5.0).text)


def _wait_for(url: str, condition: Callable[[TrtLlmMetrics], bool], what: str) -> TrtLlmMetrics:
    """Poll the replica's metrics page (there is no event to wait on across processes), bounded."""
    deadline = time.monotonic() + 20.0
    last = _metrics(url)
    while not condition(last):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {last}")
        time.sleep(0.02)
        last = _metrics(url)
    return last


def _idle(m: TrtLlmMetrics) -> bool:
    return m.active_requests == 0 and m.used_blocks == 0


def test_a_client_hanging_up_frees_the_triton_engine(
    edge_on_triton: LiveServer, local_triton: LocalTriton
) -> None:
    url = local_triton.process.metrics_url
    before = _wait_for(url, _idle, "idle before the test")
    body = {k: v for k, v in BODY.items() if k != "stream_options"} | {"max_tokens": 1500, "seed": 6}
    with httpx.Client(base_url=edge_on_triton.base_url, timeout=30.0) as client:
        with client.stream("POST", CHAT, json=body, headers=edge_on_triton.auth("paid")) as response:
            assert response.status_code == 200
            contents = 0
            for line in response.iter_lines():
                contents += '"content"' in line
                if contents >= 3:
                    break
    # The edge sees the closed connection, closes its upstream stream, and Triton cancels it.
    after = _wait_for(url, lambda m: _idle(m) and m.iterations > before.iterations, "after hanging up")
    assert after.iterations - before.iterations < 1000
