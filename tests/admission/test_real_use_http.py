"""Real-use accounting through the whole edge: a streamed request's charge on its replica follows the
tokens it has received, a margin ahead, instead of sitting at prompt + max_tokens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from edge.config import Settings
from edge.upstreams.base import Capacity, Delta, GenerationRequest, Upstream
from edge.upstreams.local_pool import local_upstreams
from tests.admission.flow import until
from tests.edge.conftest import ENGINE_WAIT_S, ROOMY_TIERS
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


class RecordedUpstream:
    """A replica as it is, recording in the edge's loop, in order, each stream's first token and its
    last (by the stream's priority): which came first at the edge is exact, whatever the timing."""

    def __init__(self, inner: Upstream) -> None:
        self.inner = inner
        self.name = inner.name
        self.events: list[tuple[int, str]] = []

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(req)

    async def _generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        first = True
        async for delta in self.inner.generate(req):
            if first and delta.token_ids:
                self.events.append((req.priority, "first"))
                first = False
            if delta.finish_reason is not None:
                self.events.append((req.priority, "end"))  # before the edge can release its slot
            yield delta

    async def capacity(self) -> Capacity:
        return await self.inner.capacity()

    async def ready(self) -> bool:
        return await self.inner.ready()

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_paid_work_past_the_reserve_runs_while_free_streams_fill_their_share(tmp_path: Path) -> None:
    """The reviewer's shape on the in-process engine (6 sequences, 160 blocks: 2,560 KV tokens, the
    default 20 % reserve and 256-token margin): four free streams of 1,000 tokens grow until their
    charges fill the free share, then a paid request whose charge alone passes the reserve arrives.
    It gets its first token while all four still run (the engine preempts free work for it when it
    must). Before, the edge counted the free charges against it and held it until a free stream
    ended."""
    recorded: list[RecordedUpstream] = []

    def provider(settings: Settings, model_dir: Path) -> Any:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            async with local_upstreams(settings, model_dir) as upstreams:
                recorded.extend(RecordedUpstream(u) for u in upstreams)
                yield list(recorded)

        return provide()

    overrides = {"tiers": ROOMY_TIERS, "engine": {"max_num_seqs": 6, "num_blocks": 160, "block_size": 16}}
    paid_prompt = " ".join(f"item{i}" for i in range(200))
    usage: dict[str, Any] = {}
    with start_server(tmp_path, overrides, provider) as server:
        (upstream,) = recorded
        (replica,) = server.app.state.runtime.pipeline.dispatcher.replicas.members
        admission = server.settings.admission
        free, paid = (server.settings.tiers[tier].priority for tier in ("free", "paid"))
        free_share = replica.kv_limit(False, admission.reserved_paid_fraction)

        async def stream(client: httpx.AsyncClient, who: str, content: str, max_tokens: int) -> None:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with client.stream("POST", CHAT, json=body, headers=server.auth(who)) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"usage":{' in line:
                        usage[content] = json.loads(line.removeprefix("data: "))["usage"]

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0) as client:
                frees = [asyncio.create_task(stream(client, "free", f"free {i}", 1000)) for i in range(4)]
                try:
                    # The edge's own count, polled (no event crosses into its thread).
                    await until(lambda: replica.kv_in_use_free >= free_share, ENGINE_WAIT_S, poll_s=0.005)
                    assert (free, "end") not in upstream.events, "a free stream ended too soon"
                    await stream(client, "paid", paid_prompt, 8)
                finally:
                    for task in frees:
                        task.cancel()
                    await asyncio.gather(*frees, return_exceptions=True)

        asyncio.run(scenario())

    paid_charge = replica.charge(usage[paid_prompt]["prompt_tokens"] + admission.real_use_margin_tokens)
    assert paid_charge > replica.kv_tokens_total - free_share  # more than the reserve alone holds
    paid_first = upstream.events.index((paid, "first"))
    free_ends = [i for i, event in enumerate(upstream.events) if event == (free, "end")]
    assert all(i > paid_first for i in free_ends), upstream.events  # before: a free stream's end came first
