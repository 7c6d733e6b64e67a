"""Two models side by side where one is served by Triton: `small` on the in-process engine,
`large` on the session's real tritonserver (tests/support/triton_server.py), through one edge."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from edge.upstreams.triton import TritonUpstream, triton_upstreams
from tests.edge.sse_client import CHAT
from tests.models.conftest import LARGE, SMALL, TWO_MODELS, replicas_of
from tests.support.live_server import LiveServer, start_server
from tests.support.triton_server import LocalTriton

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, local_triton: LocalTriton) -> Iterator[LiveServer]:
    providers = {LARGE: triton_upstreams(local_triton.spec)}
    with start_server(tmp_path_factory.mktemp("mixed-models"), TWO_MODELS, providers) as live:
        yield live


def test_each_tier_reaches_its_models_own_replicas(mixed: LiveServer) -> None:
    (triton,) = replicas_of(mixed, LARGE)
    assert isinstance(triton, TritonUpstream)
    assert not isinstance(replicas_of(mixed, SMALL)[0], TritonUpstream)
    with httpx.Client(base_url=mixed.base_url, timeout=60.0) as client:
        for who, model in (("paid", LARGE), ("paid", SMALL), ("free", SMALL)):
            body = {"model": model, "messages": HI, "max_tokens": 4, "stream": True}
            with client.stream("POST", CHAT, json=body, headers=mixed.auth(who)) as answer:
                assert answer.status_code == 200
                text = answer.read().decode()
            assert f'"model":"{model}"' in text.replace(" ", "") and text.rstrip().endswith("[DONE]")
        # The Triton-served model is the paid tier's default, and out of the free tier's reach.
        default = client.post(
            CHAT, json={"model": "", "messages": HI, "max_tokens": 4}, headers=mixed.auth("paid")
        )
        assert default.status_code == 200 and default.json()["model"] == LARGE
        assert default.json()["usage"]["completion_tokens"] > 0
        forbidden = client.post(CHAT, json={"model": LARGE, "messages": HI}, headers=mixed.auth("free"))
        assert forbidden.status_code == 404 and forbidden.json()["error"]["code"] == "model_not_found"
