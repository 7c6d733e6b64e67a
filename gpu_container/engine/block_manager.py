"""Paged KV-cache bookkeeping: which fixed-size blocks of the one preallocated pool each sequence owns."""

from __future__ import annotations

from collections import deque

from gpu_container.engine.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO reuse spreads writes over the pool; any order would be correct.
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def free_block_ids(self) -> tuple[int, ...]:
        return tuple(self._free)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks seq needs so that its first num_tokens tokens have a KV slot."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_hold(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self._free)

    def reserve(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's block table to cover num_tokens tokens; the caller checked can_hold."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > len(self._free):
            raise RuntimeError(f"KV pool exhausted: need {needed} blocks, {len(self._free)} free")
        seq.block_table.extend(self._free.popleft() for _ in range(needed))

    def free(self, seq: Sequence) -> None:
        """Take back all of seq's blocks: none of its K/V is cached any more."""
        self._free.extend(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0
