"""Two models in one Triton: one model repository with a folder per model (`fg_small`, `fg_large`),
one tritonserver, and the edge's two [models.*] naming it with their own `triton_model`, through the
settings path `floodgate serve` takes (no provider handed in)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from edge.upstreams.triton import TritonUpstream
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from gpu_container.triton.trtllm_metrics import parse_trtllm_metrics
from tests.edge.sse_client import CHAT, wait_until
from tests.models.conftest import LARGE, SMALL, TWO_MODELS, replicas_of
from tests.support.live_server import LiveServer, demo_model_dir, start_server
from tests.support.triton_server import ENGINE_CONFIG

HI = [{"role": "user", "content": "hi"}]
TRITON_MODELS = {SMALL: "fg_small", LARGE: "fg_large"}


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    repository = tmp_path_factory.mktemp("two-model-repository")
    for name in TRITON_MODELS.values():
        render_cpu_repository(repository, demo_model_dir(), ENGINE_CONFIG, model_name=name)
    process = start_local_triton(repository)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, triton: TritonProcess) -> Iterator[LiveServer]:
    spec = triton.replica_spec
    models = {
        name: TWO_MODELS["models"][name] | {"triton": spec, "triton_model": TRITON_MODELS[name]}
        for name in (SMALL, LARGE)
    }
    with start_server(tmp_path_factory.mktemp("edge-two-triton"), TWO_MODELS | {"models": models}) as live:
        yield live


def _generated(triton: TritonProcess, model: str) -> int:
    page = httpx.get(triton.metrics_url, timeout=10.0).text
    return parse_trtllm_metrics(page, TRITON_MODELS[model]).generated_tokens


def _reached(triton: TritonProcess, model: str, tokens: int) -> Callable[[], bool]:
    return lambda: _generated(triton, model) >= tokens


def test_each_model_runs_on_its_own_triton_model(edge: LiveServer, triton: TritonProcess) -> None:
    for model in (SMALL, LARGE):
        (replica,) = replicas_of(edge, model)
        assert isinstance(replica, TritonUpstream) and replica.model_name == TRITON_MODELS[model]
    with httpx.Client(base_url=edge.base_url, timeout=60.0) as client:
        for who, model in (("paid", LARGE), ("free", SMALL), ("paid", "")):
            served = LARGE if model == "" else model
            other = SMALL if served == LARGE else LARGE
            before = {m: _generated(triton, m) for m in (SMALL, LARGE)}
            answer = client.post(
                CHAT, json={"model": model, "messages": HI, "max_tokens": 4}, headers=edge.auth(who)
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == served
            n = answer.json()["usage"]["completion_tokens"]
            assert n > 0
            # The CPU model exports its counter every metrics period: wait for it, bounded.
            wait_until(_reached(triton, served, before[served] + n), what=f"{served}'s tokens")
            assert _generated(triton, other) == before[other]
        forbidden = client.post(CHAT, json={"model": LARGE, "messages": HI}, headers=edge.auth("free"))
        assert forbidden.status_code == 404 and forbidden.json()["error"]["code"] == "model_not_found"
