"""The in-thread engine as an upstream: LLMEngine's step loop in a thread of this process.

The engine thread's callback hands each output to the event loop with call_soon_threadsafe (the
mailbox); everything the contract asks of a replica is front.py's. Used where the engine must share
the process: `[engine] isolation = "thread"`, tests that reach into the engine, and benchmarks.
The default replica is the engine in its own process (engine_process.py).
"""

from __future__ import annotations

from gpu_container.contract import GenerationRequest
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.front import EngineFront
from gpu_container.engine.mailbox import Mailbox
from gpu_container.engine.types import EngineStats, SamplingParams


class AsyncEngine(EngineFront):
    def __init__(self, engine: LLMEngine, name: str = "engine") -> None:
        self.name = name
        self.engine = engine

    def _submit(self, req: GenerationRequest, params: SamplingParams, mailbox: Mailbox) -> None:
        self.engine.add_request(
            req.request_id, req.prompt_ids, params, mailbox.post, req.priority, req.cache_salt
        )

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def running(self) -> bool:
        return self.engine.running

    def stop(self) -> None:
        self.engine.stop()
