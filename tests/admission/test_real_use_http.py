"""Real-use accounting through the whole edge: a streamed request's charge on its replica follows the
tokens it has received, a margin ahead, instead of sitting at prompt + max_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from edge.config import Settings
from edge.upstreams.base import Capacity, Delta, GenerationRequest, Upstream
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, events
from tests.support.live_server import start_server

MARGIN, BLOCK, REPLY = 16, 16, 80


class ProbedUpstream:
    """Streams REPLY tokens; each time the edge asks for the next one, it reads the edge's charge on
    this replica (by then the edge has handled every token before it)."""

    name = "probed"

    def __init__(self) -> None:
        self.probe: Callable[[], int] = lambda: -1
        self.charges: list[int] = []  # charges[k]: with k tokens received
        self.prompt_tokens = 0

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(req)

    async def _generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        self.prompt_tokens = len(req.prompt_ids)
        for k in range(REPLY):
            self.charges.append(self.probe())
            yield Delta([300 + k % 50], "length" if k == REPLY - 1 else None)

    async def capacity(self) -> Capacity:
        return Capacity(100_000, 0, 8, 0, 0, BLOCK)

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def test_a_streams_charge_grows_with_its_tokens_a_margin_ahead(tmp_path: Path) -> None:
    upstream = ProbedUpstream()

    def provider(settings: Settings, model_dir: Path) -> Any:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            yield [upstream]

        return provide()

    overrides = {
        "tiers": ROOMY_TIERS,
        "admission": {"kv_accounting": "real_use", "real_use_margin_tokens": MARGIN},
    }
    with start_server(tmp_path, overrides, provider) as server:
        replica = server.app.state.runtime.pipeline.dispatcher.replicas.members[0]
        upstream.probe = lambda: replica.kv_in_use
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}
        with (
            httpx.Client(base_url=server.base_url, timeout=30.0, headers=server.auth("paid")) as client,
            client.stream("POST", CHAT, json=body | {"stream": True}) as stream,
        ):
            list(events(stream))
        left = replica.kv_in_use

    def blocks(tokens: int) -> int:
        return -(-tokens // BLOCK) * BLOCK

    prompt = upstream.prompt_tokens
    assert upstream.charges == [blocks(prompt + k + MARGIN) for k in range(REPLY)]
    assert upstream.charges[-1] < blocks(prompt + 1000)  # far below the worst case
    assert left == 0
