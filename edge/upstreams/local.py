"""The CPU engine as an upstream replica: what `make serve` runs with no GPU.

The engine behind it is either an EngineProcess (the default: its own process, off the event
loop's GIL) or an AsyncEngine around an in-thread LLMEngine (`isolation = "thread"`, and tests
that reach into the engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq
from typing import Protocol

from edge.cancel.stream_close import aclose_stream
from edge.upstreams.base import Capacity, Delta, GenerationRequest, RequestRejected, UpstreamError
from gpu_container.engine.types import EngineStats, SamplingParams, TokenOutput


class EngineHandle(Protocol):
    """What LocalUpstream needs of an engine (AsyncEngine and EngineProcess both are one)."""

    def generate(
        self, request_id: str, prompt_ids: Seq[int], params: SamplingParams, priority: int = 0
    ) -> AsyncIterator[TokenOutput]: ...

    def stats(self) -> EngineStats: ...

    @property
    def running(self) -> bool: ...

    def stop(self) -> None: ...


class LocalUpstream:
    def __init__(self, name: str, engine: EngineHandle) -> None:
        self.name = name
        self._engine = engine

    @property
    def engine(self) -> EngineHandle:
        return self._engine

    async def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        params = SamplingParams(
            max_new_tokens=req.max_new_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop_token_ids=tuple(req.stop_ids),
        )
        outs = self._engine.generate(req.request_id, req.prompt_ids, params, req.priority)
        try:
            async for out in outs:
                if out.error is not None:
                    raise UpstreamError(out.error)
                yield Delta(out.token_ids, out.finish_reason)
        except ValueError as exc:
            # The engine refused the request's own parameters (a prompt it cannot hold, a bad
            # sampling value): the request's fault, not this replica's.
            raise RequestRejected(str(exc)) from exc
        except RuntimeError as exc:
            # The engine is stopped: the replica's fault.
            raise UpstreamError(str(exc)) from exc
        finally:
            # Leaving early must close the engine's stream at once: that aborts the sequence.
            await aclose_stream(outs)

    async def capacity(self) -> Capacity:
        stats = self._engine.stats()
        return Capacity(
            kv_tokens_total=stats.kv_tokens_total,
            kv_tokens_used=stats.kv_tokens_used,
            max_sequences=stats.max_num_seqs,
            running=stats.running,
            waiting=stats.waiting,
            kv_block_tokens=stats.block_size,
            kv_tokens_cached=stats.cached_blocks * stats.block_size,
            prefix_query_tokens=stats.prefix_query_tokens,
            prefix_hit_tokens=stats.prefix_hit_tokens,
            preemptions=stats.preemptions,
        )

    async def ready(self) -> bool:
        return self._engine.running

    async def aclose(self) -> None:
        # Stopping waits for the engine's current step (or its process's exit): off the loop.
        await asyncio.to_thread(self._engine.stop)
