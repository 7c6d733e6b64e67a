"""A zero-cost replica that streams at a real model's pace (bench.streams).

Like an engine stepping its batch, one timer per step hands every running sequence of a replica
its next token: the upstream itself costs one `set_result` per token, so what a process spends per
token at this pace is the edge's own cost. An edge fronts many replicas whose steps do not line
up: `replicas` step clocks, their phases spread over the interval, take the streams in turn
(replicas=1: all tokens arrive together; one per stream: every token is its own wake-up).
The first token comes at once (prefill is free here), so a one-token request measures what
setting a stream up costs.

A step hands each sequence its delta through the edge's `offer` where the edge gave one
(`generate_direct`, edge/upstreams/direct.py): the stream's task then sleeps on, as with a real
engine's batched delivery; otherwise, or when the edge declines, it sets the stream's future. The
step's chunk writes are held and written in a row, as the engine process's delivery has the edge do
(edge/writes_together.py).

Every token is the id of " The" (4 characters, whole): a client counts the tokens it received
exactly from the text, whether the edge sent them one per event or several in one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from edge.upstreams.base import Capacity, Delta, GenerationRequest
from edge.upstreams.direct import DeltaSink
from edge.writes_together import writes_together

TOKEN_ID = 440
TOKEN_TEXT = " The"
# What bench.relay's unpaced zero-cost upstreams hand out instead: whole-word ids of the demo
# tokenizer (" The quick brown fox jumps over the lazy dog, and then it runs far away."), every id a
# complete piece of text, so each one is one chunk.
TOKEN_CYCLE = [440, 392, 75, 492, 894, 386, 270, 81, 90, 223, 76, 87, 79, 505, 881, 262, 306, 67, 92, 91]


class _Sequence:
    """One running sequence: the future its task sleeps on, and what the step hands it next."""

    __slots__ = ("fut", "left", "offer")

    def __init__(self, fut: asyncio.Future[Delta], left: int, offer: DeltaSink | None) -> None:
        self.fut = fut
        self.left = left
        self.offer = offer

    def next_delta(self) -> Delta:
        self.left -= 1
        return Delta([TOKEN_ID], None if self.left else "length")


class _StepClock:
    """One replica's engine steps: every `interval_s` (from `phase_s` on), all waiting sequences."""

    def __init__(self, interval_s: float, phase_s: float) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # kept: get_running_loop costs a getpid()
        self.interval_s = interval_s
        self.phase_s = phase_s
        self.waiting: list[_Sequence] = []
        self.live = 0
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.live += 1
        self.loop = loop
        if self._timer is None:
            self._due = loop.time() + self.phase_s
            self._timer = loop.call_at(self._due, self._step)

    def _step(self) -> None:
        waiting, self.waiting = self.waiting, []
        # As the engine process's delivery does on the edge (edge/upstreams/local_pool.py).
        writes_together(self._hand, waiting)
        self._timer = None
        if self.live and self.loop is not None:
            # A fixed rate, as a replica's steps do not wait for the edge: timed from when this step
            # was due, not from the end of the work it caused here (the streams relayed in it).
            self._due = max(self._due + self.interval_s, self.loop.time())
            self._timer = self.loop.call_at(self._due, self._step)

    def _hand(self, waiting: Sequence[_Sequence]) -> None:
        asleep = self.waiting
        for seq in waiting:
            fut = seq.fut
            if fut.done():
                continue  # its task was cancelled
            delta = seq.next_delta()
            if seq.offer is not None and seq.left and seq.offer(delta):
                asleep.append(seq)  # relayed already: the task sleeps on the same future
            else:
                fut.set_result(delta)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class PacedUpstream:
    name = "paced"

    def __init__(self, interval_s: float, replicas: int = 1) -> None:
        self._clocks = [_StepClock(interval_s, interval_s * (1 + i / replicas)) for i in range(replicas)]
        self._next = 0

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self.generate_direct(req, None)

    async def generate_direct(self, req: GenerationRequest, offer: DeltaSink | None) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        clock = self._clocks[self._next % len(self._clocks)]
        self._next += 1
        clock.start(loop)
        try:
            seq = _Sequence(loop.create_future(), req.max_new_tokens, offer)
            yield seq.next_delta()
            while seq.left:
                seq.fut = loop.create_future()
                clock.waiting.append(seq)
                yield await seq.fut
        finally:
            clock.live -= 1

    async def capacity(self) -> Capacity:
        # KV blocks of 16 tokens, as the CPU engine's (and bench/zero_cost_replica.py's 64, as
        # TensorRT-LLM's): a replica that reported none would have its streams' real-use charge
        # grow with every token (edge/admission/slot.py), which no paged engine makes it do.
        return Capacity(
            kv_tokens_total=1 << 40,
            kv_tokens_used=0,
            max_sequences=1 << 20,
            running=0,
            waiting=0,
            kv_block_tokens=16,
        )

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        for clock in self._clocks:
            clock.stop()
