"""One step's work flattened for the model: every scheduled token in one batch, plus where each
sequence's slice of it sits and which K/V blocks it reads."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from gpu_container.engine.arrays import Ints
from gpu_container.engine.block_manager import blocks_for
from gpu_container.engine.scheduler import ScheduledChunk


@dataclass(frozen=True, slots=True)
class SequenceSlice:
    start: int  # first row of this sequence in the flat batch
    length: int  # tokens computed this step
    context_len: int  # tokens visible to attention: cached ones plus this chunk
    block_table: Ints  # int64 block ids covering context_len tokens


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    token_ids: Ints  # [N]
    positions: Ints  # [N]
    slot_mapping: Ints  # [N]: block * block_size + offset where each token's K/V goes
    slices: tuple[SequenceSlice, ...]
    logits_rows: Ints  # rows of the flat batch whose next-token logits are wanted

    @classmethod
    def from_chunks(cls, chunks: Seq[ScheduledChunk], block_size: int) -> ForwardBatch:
        token_ids: list[int] = []
        positions: list[Ints] = []
        slots: list[Ints] = []
        slices: list[SequenceSlice] = []
        logits_rows: list[int] = []
        for chunk in chunks:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            stop = start + chunk.num_tokens
            table = np.asarray(seq.block_table[: blocks_for(stop, block_size)], dtype=np.int64)
            slices.append(SequenceSlice(len(token_ids), chunk.num_tokens, stop, table))
            token_ids.extend(seq.token_ids(start, stop))
            pos = np.arange(start, stop, dtype=np.int64)
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            if chunk.completes:
                logits_rows.append(len(token_ids) - 1)
        return cls(
            token_ids=np.asarray(token_ids, dtype=np.int64),
            positions=np.concatenate(positions),
            slot_mapping=np.concatenate(slots),
            slices=tuple(slices),
            logits_rows=np.asarray(logits_rows, dtype=np.int64),
        )

    def rows(self, start: int, stop: int, block_size: int) -> ForwardBatch:
        """Rows [start, stop) as a batch of their own, each sequence's slice cut to its rows there.

        Run in order, the parts of a batch compute what it does (a part's attention reads the K/V
        the parts before it wrote), and the work can stop between two of them: the prefill lane
        (prefill_lane.py) runs a large chunk as a few such forwards."""
        slices: list[SequenceSlice] = []
        for s in self.slices:
            first, last = max(start, s.start), min(stop, s.start + s.length)
            if first >= last:
                continue
            context = s.context_len - (s.start + s.length - last)
            table = s.block_table[: blocks_for(context, block_size)]
            slices.append(SequenceSlice(first - start, last - first, context, table))
        logits = self.logits_rows[(self.logits_rows >= start) & (self.logits_rows < stop)]
        return ForwardBatch(
            token_ids=self.token_ids[start:stop],
            positions=self.positions[start:stop],
            slot_mapping=self.slot_mapping[start:stop],
            slices=tuple(slices),
            logits_rows=logits - start,
        )
