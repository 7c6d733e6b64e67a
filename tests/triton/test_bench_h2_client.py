"""bench/triton_h2.py, the hand-read HTTP/2 gRPC stream `bench.triton_clients` measures beside the
edge's client: against the session's real tritonserver it streams the same greedy tokens as the
edge's TritonUpstream, for many requests at once on one stream, and every request ends."""

from __future__ import annotations

import asyncio

import pytest

from bench.triton_h2 import H2SharedStream
from bench.triton_shared_stream import SharedStreamUpstream
from edge.upstreams.base import GenerationRequest, Upstream
from edge.upstreams.triton import TritonUpstream
from tests.support.triton_server import LocalTriton

pytestmark = pytest.mark.anyio


async def _tokens(upstream: Upstream, request_id: str, prompt: list[int]) -> tuple[list[int], str | None]:
    tokens: list[int] = []
    finish: str | None = None
    async for delta in upstream.generate(GenerationRequest(request_id, prompt, 24, temperature=0.0)):
        tokens += delta.token_ids
        finish = delta.finish_reason or finish
    return tokens, finish


async def test_one_shared_stream_gives_every_request_the_edges_tokens(local_triton: LocalTriton) -> None:
    process = local_triton.process
    edge = TritonUpstream("sse", process.http_url, process.metrics_url)
    h2 = SharedStreamUpstream(
        TritonUpstream("h2", process.http_url, process.metrics_url), process.grpc_url, kind="h2"
    )
    prompts = [[11 + i, 42, 7, 300 + i, 5, 91] for i in range(8)]
    try:
        expected = await asyncio.gather(*(_tokens(edge, f"sse-{i}", p) for i, p in enumerate(prompts)))
        got = await asyncio.gather(*(_tokens(h2, f"h2-{i}", p) for i, p in enumerate(prompts)))
        # One stream carried them all, and stays open for the next.
        assert isinstance(h2.stream, H2SharedStream) and h2.stream.alive
        assert h2.stream.messages >= len(prompts)
    finally:
        await h2.aclose()
        await edge.aclose()
    assert got == expected
    assert all(tokens and finish is not None for tokens, finish in got)
