"""Two models behind one edge: `small` (free's default) and `large` (paid's default, weight 2).

Both are the demo checkpoint, each with its own engine, dispatcher and pipeline: what differs is
the edge's side (tiers, queues, token weight, sampling defaults), which is what these tests check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from edge.upstreams.base import Upstream
from tests.support.live_server import LiveServer, start_server
from tests.support.redis_server import start_redis
from tests.support.triton_server import local_triton

__all__ = ["local_triton"]

SMALL, LARGE = "small", "large"

_ROOMY = {
    "requests_per_window": 1000,
    "request_window_s": 3600,
    "tokens_per_window": 10_000_000,
    "token_window_s": 3600,
    "max_concurrent": 8,
    "max_tokens": 1024,
    "on_store_failure": "open",
}

TWO_MODELS: dict[str, Any] = {
    "models": {
        SMALL: {"source": "demo"},
        # Greedy by default: two seeds give the same reply unless the request asks for sampling.
        LARGE: {"source": "demo", "token_weight": 2.0, "default_temperature": 0.0, "default_top_p": 1.0},
    },
    "tiers": {
        "free": _ROOMY | {"priority": 0, "max_queue_wait_s": 30.0, "models": [SMALL], "default_model": SMALL},
        "paid": _ROOMY
        | {"priority": 10, "max_queue_wait_s": 60.0, "models": [LARGE, SMALL], "default_model": LARGE},
    },
    "server": {"max_body_bytes": 65536},
    # Two running sequences per replica: a third request on a model queues in its dispatcher.
    "engine": {"max_num_seqs": 2},
}


@pytest.fixture(scope="package")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("two-models"), TWO_MODELS) as live:
        yield live


def replicas_of(server: LiveServer, model: str) -> list[Upstream]:
    """A model's own replicas (the runtime lists every model's, in the models' order)."""
    runtime = server.app.state.runtime
    names = dict(runtime.models.pipelines())[model].dispatcher.upstream_names()
    start = 0
    for name, pipeline in runtime.models.pipelines():
        count = len(pipeline.dispatcher.upstream_names())
        if name == model:
            mine: list[Upstream] = runtime.upstreams[start : start + count]
            assert [u.name for u in mine] == names
            return mine
        start += count
    raise KeyError(model)


@pytest.fixture(scope="package")
def redis_url() -> Iterator[str]:
    """A real redis-server for this package's tests (they keep apart by user names)."""
    server = start_redis()
    yield server.url
    server.stop()
