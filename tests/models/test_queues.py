"""Each model has its own queue: a flood on one never holds up the other."""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack

import httpx

from edge.admission.dispatcher import Dispatcher
from gpu_container.engine.engine_process import EngineProcess
from tests.edge.sse_client import CHAT, wait_until
from tests.models.conftest import LARGE, SMALL, replicas_of
from tests.support.live_server import LiveServer

HI = [{"role": "user", "content": "hi"}]


def _dispatcher(server: LiveServer, model: str) -> Dispatcher:
    dispatcher: Dispatcher = dict(server.app.state.runtime.models.pipelines())[model].dispatcher
    return dispatcher


def test_a_flood_on_one_model_does_not_queue_the_other(two_models: LiveServer) -> None:
    """`small`'s engine is paused (SIGSTOP: real, and nothing it runs can finish), then flooded past
    its two sequences: its third request waits in `small`'s queue. `large` still answers at once,
    its own queue empty, while `small`'s request is still waiting."""
    (engine,) = replicas_of(two_models, SMALL)
    assert isinstance(engine, EngineProcess) and engine.pid is not None
    small, large = _dispatcher(two_models, SMALL), _dispatcher(two_models, LARGE)
    flood = {"model": SMALL, "messages": HI, "max_tokens": 50, "stream": True}
    os.kill(engine.pid, signal.SIGSTOP)
    try:
        with ExitStack() as streams, httpx.Client(base_url=two_models.base_url, timeout=60.0) as client:
            for _ in range(3):
                streams.enter_context(
                    client.stream("POST", CHAT, json=flood, headers=two_models.auth("paid"))
                )
            wait_until(lambda: small.queue_depth() == 1, what="a request queued on the small model")
            answer = client.post(
                CHAT, json={"model": LARGE, "messages": HI, "max_tokens": 4}, headers=two_models.auth("paid")
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == LARGE
            assert small.queue_depth() == 1
            assert large.queue_depth() == 0
            # The operator sees which model's queue it is.
            assert 'floodgate_queue_depth{model="small",tier="paid"} 1.0' in two_models.metrics_text()
            os.kill(engine.pid, signal.SIGCONT)
    finally:
        os.kill(engine.pid, signal.SIGCONT)
    wait_until(lambda: small.queue_depth() == 0, what="the small model's queue to empty")
