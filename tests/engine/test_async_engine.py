"""AsyncEngine: the engine's async front coalesces when the consumer lags and aborts when it leaves early."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anyio.to_thread
import pytest

from gpu_container.contract import Delta, GenerationRequest, RequestRejected
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.engine.collector import TIMEOUT_S
from tests.engine.tiny_llama import tiny_model


def forever(request_id: str, prompt: list[int]) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, max_new_tokens=1_000_000, temperature=0.0, ignore_eos=True)


@pytest.fixture
def engine() -> Iterator[LLMEngine]:
    config = EngineConfig(block_size=4, num_blocks=32, max_num_seqs=8, max_num_batched_tokens=16)
    engine = LLMEngine(tiny_model()[0], config, eos_token_ids=[1])
    engine.start()
    yield engine
    engine.stop()


async def _idle(engine: LLMEngine) -> None:
    assert await anyio.to_thread.run_sync(engine.wait_until_idle, TIMEOUT_S)


@pytest.mark.anyio
async def test_a_lagging_consumer_gets_the_backlog_in_one_output(engine: LLMEngine) -> None:
    outputs: list[Delta] = []
    req = GenerationRequest("lagging", [2, 3, 4], max_new_tokens=40, temperature=0.0, ignore_eos=True)
    stream = AsyncEngine(engine).generate(req)
    outputs.append(await anext(stream))
    await _idle(engine)  # the engine finishes while nobody reads
    outputs += [output async for output in stream]
    assert sum(len(o.token_ids) for o in outputs) == 40
    assert len(outputs) <= 2 and outputs[-1].finish_reason == "length"
    assert all(o.finish_reason is None for o in outputs[:-1])


@pytest.mark.anyio
async def test_aclose_aborts_the_request_and_frees_its_blocks(engine: LLMEngine) -> None:
    stream = AsyncEngine(engine).generate(forever("closed", [5] * 10))
    first = await anext(stream)
    assert first.token_ids and engine.stats().free_blocks < engine.stats().num_blocks
    await stream.aclose()
    await _idle(engine)
    assert engine.stats().free_blocks == engine.stats().num_blocks


@pytest.mark.anyio
async def test_breaking_out_of_the_loop_aborts_the_request(engine: LLMEngine) -> None:
    async for output in AsyncEngine(engine).generate(forever("broken", [6, 7])):
        assert output.token_ids
        break
    await _idle(engine)
    assert engine.stats().free_blocks == engine.stats().num_blocks


@pytest.mark.anyio
async def test_cancelling_the_consumer_task_aborts_the_request(engine: LLMEngine) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in AsyncEngine(engine).generate(forever("cancelled", [8, 9])):
            started.set()

    task = asyncio.create_task(consume())
    with anyio.fail_after(TIMEOUT_S):
        await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _idle(engine)
    assert engine.stats().free_blocks == engine.stats().num_blocks


@pytest.mark.anyio
async def test_concurrent_streams_each_end_once(engine: LLMEngine) -> None:
    bridge = AsyncEngine(engine)

    async def run(i: int) -> list[Delta]:
        req = GenerationRequest(
            f"c{i}", [2 + i] * (1 + i), max_new_tokens=5 + i, temperature=0.7, seed=i, ignore_eos=True
        )
        return [o async for o in bridge.generate(req)]

    results = await asyncio.gather(*(run(i) for i in range(12)))
    for i, outputs in enumerate(results):
        assert sum(len(o.token_ids) for o in outputs) == 5 + i
        assert [o.finish_reason for o in outputs].count("length") == 1
        assert outputs[-1].finish_reason == "length"
    assert bridge.stats().running == 0


@pytest.mark.anyio
async def test_invalid_request_raises_on_first_iteration(engine: LLMEngine) -> None:
    with pytest.raises(RequestRejected, match="empty"):
        await anext(AsyncEngine(engine).generate(forever("empty", [])))
