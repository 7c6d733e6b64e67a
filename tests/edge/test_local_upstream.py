"""The in-process engine as an upstream: what its front reports to the dispatcher."""

from __future__ import annotations

import threading

import pytest

from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig, SamplingParams, TokenOutput
from tests.support.live_server import demo_model_dir

pytestmark = pytest.mark.anyio


def _engine(block_size: int = 16) -> LLMEngine:
    return LLMEngine.from_pretrained(demo_model_dir(), EngineConfig(block_size=block_size, num_blocks=32))


async def test_capacity_reports_the_engines_kv_block_size() -> None:
    upstream = AsyncEngine(_engine(block_size=8), "local-0")
    capacity = await upstream.capacity()
    assert capacity.kv_block_tokens == 8
    assert capacity.kv_tokens_total == 8 * 32


async def test_ready_only_while_the_engine_runs() -> None:
    engine = _engine()
    upstream = AsyncEngine(engine, "local-0")
    assert not await upstream.ready()
    engine.start()
    assert await upstream.ready()
    await upstream.aclose()
    assert not await upstream.ready()


class _LoopKiller(BaseException):
    """Escapes the engine loop's `except Exception`: its thread dies as from a fatal bug."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_not_ready_once_the_engine_loop_died() -> None:
    engine = _engine()
    engine.start()
    loop_thread: list[threading.Thread] = []
    called = threading.Event()

    def on_output(_: TokenOutput) -> None:
        loop_thread.append(threading.current_thread())
        called.set()
        raise _LoopKiller

    engine.add_request("r1", [1, 2, 3], SamplingParams(max_new_tokens=4), on_output)
    try:
        assert called.wait(timeout=10)
        loop_thread[0].join(timeout=10)
        assert not loop_thread[0].is_alive()
        assert not await AsyncEngine(engine, "local-0").ready()
    finally:
        engine.stop()
