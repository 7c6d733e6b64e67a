"""The default replicas: `engine.replicas` CPU engines, started and stopped with the app, each this
process's own (PrivateUpstreams: `serve --workers N` starts N sets, one per worker).

Each engine runs in its own process by default (gpu_container/engine/engine_process.py), so its
Python never competes with the event loop for the GIL; `isolation = "thread"` keeps it in this one.
Either way the engine's front is itself the upstream (gpu_container/engine/front.py): the edge
speaks the seam's contract to it directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from edge.config import EngineSettings, Settings
from edge.upstreams.base import Upstream
from edge.writes_together import writes_together
from gpu_container.engine.engine_process import EngineProcess
from gpu_container.engine.front import EngineFront

# How the app gets its replicas: settings and the checkpoint directory in, live upstreams out for
# the app's lifetime. `floodgate serve --triton` swaps in one from edge/upstreams/triton.py.
UpstreamProvider = Callable[[Settings, Path], AbstractAsyncContextManager[list[Upstream]]]


class PrivateUpstreams(list[Upstream]):
    """Replicas this process started for itself (the local engines, `--triton local`): no other edge
    instance reaches them, so the fleet's share (edge/membership/, `[limiter] instance_count`) does
    not divide them, and this instance fills each whole. A provider yields this instead of a plain
    list for such replicas; a plain list is replicas every instance sends work to (Triton hosts)."""


def _start_engine(settings: EngineSettings, model_dir: Path, name: str) -> EngineFront:
    """Blocking (loads the model): run it in a worker thread."""
    config = settings.engine_config()
    if settings.isolation == "process":
        process = EngineProcess(
            model_dir, config, name, run_delivery=writes_together, stall_timeout_s=settings.stall_timeout_s
        )
        process.start()
        return process
    # Imported here: the engine loads numpy and OpenBLAS's threads, which an edge whose engines run
    # in their own processes (the default) never uses.
    from gpu_container.engine.async_engine import AsyncEngine
    from gpu_container.engine.engine import LLMEngine

    engine = LLMEngine.from_pretrained(model_dir, config)
    engine.start()
    return AsyncEngine(engine, name)


@asynccontextmanager
async def local_upstreams(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
    # Beside other models ([models.*]) a replica is named after its model, so readiness and the
    # per-replica metrics tell them apart.
    prefix = f"{settings.model.name}/" if settings.models else ""
    names = [f"{prefix}local-{i}" for i in range(settings.engine.replicas)]
    started = await asyncio.gather(
        *(asyncio.to_thread(_start_engine, settings.engine, model_dir, name) for name in names),
        return_exceptions=True,
    )
    upstreams = [e for e in started if not isinstance(e, BaseException)]
    try:
        for failure in started:
            if isinstance(failure, BaseException):
                raise failure
        yield PrivateUpstreams(upstreams)
    finally:
        for upstream in upstreams:
            await upstream.aclose()
