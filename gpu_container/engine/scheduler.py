"""Continuous batching with chunked prefill, priority admission and preemption by recompute.

Every step first gives each running sequence its next tokens (one for a decode, the next chunk for a
prompt still being prefilled) in priority order, then admits waiting sequences into the budget that
is left. A step's token budget (max_num_batched_tokens) is shared by decodes and prefill chunks, so a
long prompt is split over several steps and never stalls the decodes of the others.

Preemption: when a running sequence needs a new block and the pool is empty, the lowest-priority,
newest running sequence gives its blocks back and returns to the waiting queue to be recomputed from
scratch (prompt and the tokens it already produced). Recompute instead of swapping to host memory:
on a CPU engine there is no slower tier to swap to, and recomputing a prefill is cheap next to
decoding; the victim keeps its arrival order, so it is readmitted before anything that came later,
and its sampler state, so a seeded request still yields the same tokens.

Admission reserves blocks for the whole known sequence up front: a sequence that is admitted never
needs preempting before its prefill ends, and one that would not fit waits (strictly in priority
order; a smaller request behind it does not jump the queue, which would starve large ones).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.sequence import Sequence, SequenceStatus
from gpu_container.engine.types import EngineConfig


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """num_tokens tokens of seq, from its num_computed_tokens on, are computed this step."""

    seq: Sequence
    num_tokens: int

    @property
    def completes(self) -> bool:
        """Whether this chunk reaches the sequence's last token, so a new token is sampled after it."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        if config.max_num_batched_tokens < 1 or config.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        self._config = config
        self._blocks = block_manager
        # Both kept sorted by Sequence.order_key: best first.
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.order_key)

    def remove(self, seq: Sequence) -> None:
        """Take seq out of the scheduler and give its blocks back (finish or abort)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self._blocks.free(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> list[ScheduledChunk]:
        budget = self._config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted = False
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted to make room for a better sequence earlier in this loop
            n = min(seq.num_uncomputed_tokens, budget)
            target = seq.num_computed_tokens + n
            while not self._blocks.can_hold(seq, target):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # seq was the worst left; everything after it has been preempted too
            self._blocks.reserve(seq, target)
            chunks.append(ScheduledChunk(seq, n))
            budget -= n
        if not preempted:
            budget = self._admit(budget, chunks)
        return chunks

    def _admit(self, budget: int, chunks: list[ScheduledChunk]) -> int:
        while self.waiting and budget > 0 and len(self.running) < self._config.max_num_seqs:
            seq = self.waiting[0]
            if not self._blocks.can_hold(seq, seq.num_tokens):
                break
            self.waiting.pop(0)
            self._blocks.reserve(seq, seq.num_tokens)
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=Sequence.order_key)
            n = min(seq.num_uncomputed_tokens, budget)
            chunks.append(ScheduledChunk(seq, n))
            budget -= n
        return budget

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._blocks.free(seq)
        self.num_preemptions += 1
        self.add(seq)

    def advance(self, chunks: Iterable[ScheduledChunk]) -> None:
        """Record that the chunks' K/V are now in the cache."""
        for chunk in chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
