"""The engine's async front: one engine as an `Upstream` of the seam's contract (gpu_container/contract.py).

The edge streams from it as from any replica. Two fronts share this class: AsyncEngine (the engine
in a thread of this process, async_engine.py) and EngineProcess (the engine in a child process,
engine_process.py); each says how to submit a request, abort one, read the stats and stop. What
the contract asks of a replica is written here, once:

- the contract's request becomes the engine's SamplingParams (sampling_params);
- the engine's outputs become Deltas in its mailbox (mailbox.py), where an output carrying an
  error raises UpstreamError;
- a request the engine refuses for its own parameters (its ValueError) raises RequestRejected, an
  engine that cannot take it (stopped, dead: RuntimeError) raises UpstreamError;
- leaving the stream early (break, aclose, task cancellation) aborts the sequence, which frees its
  KV blocks at the engine's next step.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncGenerator, Callable

from gpu_container.contract import (
    Capacity,
    Delta,
    GenerationRequest,
    RequestRejected,
    UpstreamError,
)
from gpu_container.engine.mailbox import Mailbox
from gpu_container.engine.types import EngineStats, SamplingParams


def sampling_params(req: GenerationRequest) -> SamplingParams:
    """The engine's terms for a contract request's sampling and ending rules."""
    return SamplingParams(
        max_new_tokens=req.max_new_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        repetition_penalty=req.repetition_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias=req.logit_bias,
        stop_token_ids=tuple(req.stop_ids),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
    )


def capacity_of(stats: EngineStats) -> Capacity:
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


class EngineFront(abc.ABC):
    """An engine that is an upstream replica: generate, capacity, ready, aclose."""

    name: str

    @abc.abstractmethod
    def _submit(self, req: GenerationRequest, params: SamplingParams, mailbox: Mailbox) -> None:
        """Hand the request (its sampling already in the engine's terms) to the engine, its outputs
        to go to `mailbox`. Raises ValueError (the
        request's fault) or RuntimeError (the engine's), or an UpstreamError of its own (the engine
        process's ReplicaRestarting); a later refusal arrives through the mailbox as RequestRejected
        or UpstreamError."""

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Have the engine drop the request and free its blocks; unknown or finished ids are ignored."""

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """Started, not stopped, and the engine alive."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Finish every open stream with "cancelled" and end the engine (blocking). Idempotent."""

    def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        """The request's deltas; it is submitted at the first iteration, so a refusal is raised there.

        Call from the event loop that will read the stream."""
        mailbox = Mailbox(asyncio.get_running_loop(), lambda: self.abort(req.request_id))
        return self._deltas(req, mailbox)

    def generate_direct(
        self, req: GenerationRequest, offer: Callable[[Delta], bool]
    ) -> AsyncGenerator[Delta, None]:
        """`generate`, with each delta the stream waits for offered to `offer` on arrival
        (edge/upstreams/direct.py); what it declines comes through the iterator, as it was offered."""
        mailbox = Mailbox(asyncio.get_running_loop(), lambda: self.abort(req.request_id))
        mailbox.offer = offer
        return self._deltas(req, mailbox)

    async def _deltas(self, req: GenerationRequest, mailbox: Mailbox) -> AsyncGenerator[Delta, None]:
        try:
            self._submit(req, sampling_params(req), mailbox)
        except ValueError as exc:
            raise RequestRejected(str(exc)) from exc
        except RuntimeError as exc:
            raise UpstreamError(str(exc)) from exc
        finished = False
        try:
            while not finished:
                delta = await mailbox.take()
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished:
                self.abort(req.request_id)

    async def capacity(self) -> Capacity:
        return capacity_of(self.stats())

    async def ready(self) -> bool:
        return self.running

    async def aclose(self) -> None:
        # Stopping waits for the engine's current step (or its process's exit): off the loop.
        await asyncio.to_thread(self.stop)
