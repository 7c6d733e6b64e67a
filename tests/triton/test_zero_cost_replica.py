"""The benchmarks' zero-cost replica (bench/zero_cost_replica.py) is read by the edge's own Triton
client as a tritonserver is: its figures stand for the Triton path only if this holds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from bench.paced_upstream import TOKEN_CYCLE, TOKEN_ID
from bench.zero_cost_replica import running_replica
from edge.upstreams.base import GenerationRequest
from edge.upstreams.triton import TritonUpstream
from tests.support.ports import free_port

WAIT_S = 20.0


@pytest.fixture(scope="module", params=[0.0, 5.0], ids=["unpaced", "paced"])
def replica(request: pytest.FixtureRequest) -> Iterator[tuple[int, float]]:
    port = free_port()
    with running_replica(port, request.param, clocks=0):
        yield port, request.param


@pytest.fixture
async def upstream(replica: tuple[int, float]) -> AsyncIterator[TritonUpstream]:
    url = f"http://127.0.0.1:{replica[0]}"
    up = TritonUpstream("zero-cost", url, f"{url}/metrics", end_id=-1)
    assert await up.ready()
    yield up
    await up.aclose()


@pytest.mark.anyio
async def test_streams_of_every_length_end_with_length(
    upstream: TritonUpstream, replica: tuple[int, float]
) -> None:
    expected = [TOKEN_ID] * 70 if replica[1] else (TOKEN_CYCLE * 4)[:70]
    for n in (1, 2, 70):
        tokens, reasons = [], []
        with anyio.fail_after(WAIT_S):
            async for delta in upstream.generate(GenerationRequest(f"r{n}", [5, 6], max_new_tokens=n)):
                tokens += delta.token_ids
                reasons.append(delta.finish_reason)
        assert tokens == expected[:n]
        assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}


@pytest.mark.anyio
async def test_it_reports_room_for_many_streams(upstream: TritonUpstream) -> None:
    capacity = await upstream.capacity()
    assert capacity.max_sequences >= 4096 and capacity.running == 0
    assert capacity.kv_tokens_used == 0 and capacity.kv_tokens_total >= 1 << 20
