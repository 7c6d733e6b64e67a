"""Live edges for the end-to-end tests, on either upstream path.

A test module that sets `UPSTREAMS = BOTH_PATHS` runs each of its tests that takes `server` once per
path: `local` (the in-process engines) and `triton` (the session's one real tritonserver,
tests/support/triton_server.py, reached through its `HOST:GRPC:METRICS` spec). Elsewhere `server`
is the in-process edge, as before. `local_server` and `triton_server` are the two edges themselves,
for tests that need one path, or both at once.

`engine_reading(server)` and `wait_for_engine_to_drop(server, before)` read the replica's own state
on either path: the in-process engines' stats, or the Triton model's metrics page (its nv_trt_llm_*
gauges and generated-tokens counter). `finished_requests(server, reason)` reads the edge's own count.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from edge.upstreams.triton import TritonUpstream, triton_upstreams
from gpu_container.engine.front import EngineFront
from gpu_container.triton.trtllm_metrics import parse_trtllm_metrics
from tests.edge.sse_client import LONG_PROMPT, LONG_TOKENS, MODEL, find_long_seed
from tests.support.live_server import LiveServer, start_server
from tests.support.triton_server import LocalTriton, local_triton

__all__ = ["local_triton"]

BOTH_PATHS = ("local", "triton")
ENGINE_WAIT_S = 20.0

# Limits high enough that the module's requests never trip them (tests of the limits start their own).
ROOMY_TIERS = {
    "free": {
        "priority": 0,
        "requests_per_window": 1000,
        "request_window_s": 3600,
        "tokens_per_window": 10_000_000,
        "token_window_s": 3600,
        "max_concurrent": 8,
        "max_tokens": 1024,
        "max_queue_wait_s": 30.0,
        "on_store_failure": "open",
    },
    "paid": {
        "priority": 10,
        "requests_per_window": 1000,
        "request_window_s": 3600,
        "tokens_per_window": 10_000_000,
        "token_window_s": 3600,
        "max_concurrent": 8,
        "max_tokens": 2000,
        "max_queue_wait_s": 60.0,
        "on_store_failure": "open",
    },
}
EDGE_SETTINGS = {"tiers": ROOMY_TIERS, "server": {"max_body_bytes": 65536}}


@pytest.fixture(scope="package")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("edge-local"), EDGE_SETTINGS) as live:
        yield live


@pytest.fixture(scope="package")
def triton_server(
    tmp_path_factory: pytest.TempPathFactory, local_triton: LocalTriton
) -> Iterator[LiveServer]:
    provider = triton_upstreams(local_triton.spec)
    with start_server(tmp_path_factory.mktemp("edge-triton"), EDGE_SETTINGS, provider) as live:
        yield live


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    paths = getattr(metafunc.module, "UPSTREAMS", None)
    if paths and "server" in metafunc.fixturenames:
        metafunc.parametrize("server", paths, indirect=True, scope="package")


@pytest.fixture(scope="package")
def server(request: pytest.FixtureRequest) -> LiveServer:
    """The edge on the path the test is parametrized with (`local` where it is not)."""
    edge: LiveServer = request.getfixturevalue(f"{getattr(request, 'param', 'local')}_server")
    return edge


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="package")
def long_body(local_server: LiveServer) -> dict[str, Any]:
    """A streaming request that generates LONG_TOKENS tokens (never stops early), on either path:
    the seed is found on the in-process engine, and Triton samples the same tokens from it
    (test_stream_contract.py compares the two)."""
    with httpx.Client(base_url=local_server.base_url, timeout=60.0) as client:
        seed = find_long_seed(client, local_server.keys["paid"])
    # And past the end token: on Triton the same seed may still end early where a step's batch
    # differs (float results that depend on the batch), and the tests waiting on a running reply
    # then waited for nothing (two fresh-clone CI runs). The seed keeps the in-process tokens.
    return {
        "model": MODEL,
        "messages": LONG_PROMPT,
        "seed": seed,
        "max_tokens": LONG_TOKENS,
        "stream": True,
        "ignore_eos": True,
    }


@dataclass(frozen=True)
class EngineReading:
    """The replicas behind an edge, read from the replicas themselves (not the edge's cached view).

    `work` only grows: the tokens the replicas generated, by their own count (the in-process
    engines' stats, or the CPU model's generated-tokens counter on Triton).
    """

    running: int
    waiting: int
    used_blocks: int
    work: int

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0 and self.used_blocks == 0


def engine_reading(server: LiveServer) -> EngineReading:
    running = waiting = used_blocks = work = 0
    for upstream in server.app.state.runtime.upstreams:
        if isinstance(upstream, EngineFront):
            stats = upstream.stats()
            running += stats.running
            waiting += stats.waiting
            used_blocks += stats.num_blocks - stats.free_blocks
            work += stats.generated_tokens
        elif isinstance(upstream, TritonUpstream):
            # Fresh from the replica: the edge's capacity cache may be older than the request.
            metrics = parse_trtllm_metrics(httpx.get(upstream.metrics_url, timeout=5.0).text)
            running += metrics.scheduled_requests
            # Admitted, not yet counted by the engine (it counts from its next step): waiting too.
            admitted = max(metrics.active_requests - metrics.scheduled_requests - metrics.waiting_requests, 0)
            waiting += metrics.waiting_requests + metrics.pending_in_triton + admitted
            used_blocks += metrics.used_blocks
            work += metrics.generated_tokens
        else:
            raise TypeError(f"no way to read the state of {upstream!r}")
    return EngineReading(running, waiting, used_blocks, work)


def wait_for_engine(server: LiveServer, done: Callable[[EngineReading], bool], what: str) -> EngineReading:
    """Poll the replicas (no event crosses into them from here) until `done(reading)`, bounded."""
    deadline = time.monotonic() + ENGINE_WAIT_S
    reading = engine_reading(server)
    while not done(reading):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {reading}")
        time.sleep(0.01)
        reading = engine_reading(server)
    return reading


def wait_for_engine_to_drop(server: LiveServer, before: EngineReading) -> EngineReading:
    """Idle with every KV block free, in a reading taken after the engine did work since `before`
    (so a gauge published before the request started cannot pass for the end of it)."""
    return wait_for_engine(
        server, lambda r: r.idle and r.work > before.work, "the engine to drop the sequence"
    )


def idle_engine(server: LiveServer) -> EngineReading:
    """A reading of the replicas once nothing earlier is still running: the baseline of a test."""
    return wait_for_engine(server, lambda r: r.idle, "the engine to be idle before the test")


def finished_requests(server: LiveServer, reason: str, tier: str = "paid") -> float:
    """The edge's own count of requests of `tier` that ended for `reason` (its /metrics page), over
    the models it serves."""
    text = server.metrics_text()
    labels = rf'model="[^"]*",reason="{reason}",tier="{tier}"'
    pattern = rf"floodgate_requests_finished_total\{{{labels}\}} ([0-9.e+]+)"
    return sum(float(match.group(1)) for match in re.finditer(pattern, text))


def finished_by_model(server: LiveServer) -> dict[str, float]:
    """The edge's own count of finished requests per model served (its /metrics page)."""
    counts: dict[str, float] = {}
    pattern = r'floodgate_requests_finished_total\{model="([^"]*)"[^}]*\} ([0-9.e+]+)'
    for match in re.finditer(pattern, server.metrics_text()):
        counts[match.group(1)] = counts.get(match.group(1), 0.0) + float(match.group(2))
    return counts


def served_models(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """The models that finished requests between two readings of `finished_by_model`."""
    return sorted(m for m, n in after.items() if n > before.get(m, 0.0))


def replica_names(server: LiveServer) -> list[str]:
    return [upstream.name for upstream in server.app.state.runtime.upstreams]
