"""The in-process engine as an upstream: what it reports to the dispatcher."""

from __future__ import annotations

import pytest

from edge.upstreams.local import LocalUpstream
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.support.live_server import demo_model_dir

pytestmark = pytest.mark.anyio


def _engine(block_size: int = 16) -> LLMEngine:
    return LLMEngine.from_pretrained(demo_model_dir(), EngineConfig(block_size=block_size, num_blocks=32))


async def test_capacity_reports_the_engines_kv_block_size() -> None:
    upstream = LocalUpstream("local-0", AsyncEngine(_engine(block_size=8)))
    capacity = await upstream.capacity()
    assert capacity.kv_block_tokens == 8
    assert capacity.kv_tokens_total == 8 * 32
