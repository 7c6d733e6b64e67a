"""The default replicas: `engine.replicas` in-process CPU engines, started and stopped with the app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from edge.config import Settings
from edge.upstreams.base import Upstream
from edge.upstreams.local import LocalUpstream
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig

# How the app gets its replicas: settings and the checkpoint directory in, live upstreams out for
# the app's lifetime. `floodgate serve --triton` swaps in one from edge/upstreams/triton.py.
UpstreamProvider = Callable[[Settings, Path], AbstractAsyncContextManager[list[Upstream]]]


@asynccontextmanager
async def local_upstreams(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
    e = settings.engine
    config = EngineConfig(
        block_size=e.block_size,
        num_blocks=e.num_blocks,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.max_model_len,
        enable_prefix_caching=e.enable_prefix_caching,
    )
    upstreams: list[LocalUpstream] = []
    try:
        for i in range(e.replicas):
            engine = LLMEngine.from_pretrained(model_dir, config)
            engine.start()
            upstreams.append(LocalUpstream(f"local-{i}", AsyncEngine(engine)))
        yield list(upstreams)
    finally:
        for upstream in upstreams:
            await upstream.aclose()
