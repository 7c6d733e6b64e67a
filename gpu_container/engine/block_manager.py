"""Paged KV-cache bookkeeping: which fixed-size blocks of the one preallocated pool each sequence
holds, and (with prefix caching) which full blocks can be shared because they hold the same prefix.

Prefix caching, the way vLLM and nano-vllm do it: once a block is full of computed K/V it is keyed
by the hash chain of every token up to its end (prefix_hash.py). A sequence being admitted looks its
full blocks up by key, takes the ones found (reference counted, read-only: nobody writes a position
before its num_computed_tokens, and a hit block lies wholly before it) and prefills only the rest.
A block whose last user lets go keeps its K/V and key: it counts as free, but is handed out again
only once no block without a key is left, least recently released first, and a later prompt with the
same prefix can take it back until then. The last, partially filled block is never keyed, so never
shared; and a fully cached sequence still recomputes its last block, because the step that computes
its last token is what yields the logits for the next one. A sequence's chain starts at the root of
its cache salt (prefix_hash.root_hash), so sequences with different salts never share a block.

A sequence's blocks are handed out consecutively where the pool allows: a sequence that grows takes
the block after its last one if that is empty, and one that needs a block elsewhere starts in the
middle of the longest run of empty blocks (at its start when nobody holds the block before it), so
whoever holds the block before that run can still grow into it. Attention then reads a context as a
few runs of consecutive blocks, each a view of the pool, instead of gathering every block of it
every step (attention.py): what a long context's step cost was spent on. Nothing depends on it for
correctness; a fragmented table is read by gathering, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpu_container.engine.prefix_hash import chain_hash
from gpu_container.engine.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class _BlockKey:
    """What a keyed block holds. The parent's key and the tokens are kept to check a hit by its own
    tokens, not by hash alone; that the block before it holds the right K/V rests on the parent's key,
    which is why keys are 128 bits wide (prefix_hash.py)."""

    hash: int
    parent: int
    tokens: tuple[int, ...]


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._refs = [0] * num_blocks
        self._keys: list[_BlockKey | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        # Free blocks holding nothing worth keeping.
        self._empty = np.ones(num_blocks, dtype=bool)
        self._num_empty = num_blocks
        # Free blocks that keep a keyed prefix, least recently released first: evicted in that order.
        self._cached: OrderedDict[int, None] = OrderedDict()
        # Tokens looked up at admission, and those of them found in the cache (admissions after a
        # preemption included: a recompute that hits its own released blocks is a real saving).
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (the cached ones included: they are taken back when needed)."""
        return self._num_empty + len(self._cached)

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix."""
        return len(self._cached)

    def free_block_ids(self) -> tuple[int, ...]:
        return (*np.flatnonzero(self._empty).tolist(), *self._cached)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks a running seq needs so that its first num_tokens tokens have a KV slot."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_hold(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def reserve(self, seq: Sequence, num_tokens: int) -> None:
        """Grow a running seq's block table to cover num_tokens tokens; the caller checked can_hold."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"KV pool exhausted: need {needed} blocks, {self.num_free_blocks} free")
        for _ in range(needed):
            seq.block_table.append(self._take_free(seq.block_table[-1] if seq.block_table else None))

    def admission_cost(self, seq: Sequence) -> int:
        """Free blocks that admitting seq whole (allocate) would take: its blocks not found in the
        cache, plus the cache hits that are free now (taking them leaves fewer free)."""
        hits = self._match(seq)
        fresh = blocks_for(seq.num_tokens, self.block_size) - len(hits)
        return fresh + sum(1 for b in hits if self._refs[b] == 0)

    def can_allocate(self, seq: Sequence) -> bool:
        return self.admission_cost(seq) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give a seq that holds no block a table for all its tokens: its cached prefix shared, the
        rest fresh. The cached tokens count as computed. The caller checked can_allocate."""
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id} already holds blocks")
        if self.admission_cost(seq) > self.num_free_blocks:
            raise RuntimeError("KV pool exhausted")
        hits = self._match(seq)
        for b in hits:  # taken first, so making room for the rest cannot evict them
            if self._refs[b] == 0:
                del self._cached[b]
            self._refs[b] += 1
        seq.block_table = list(hits)
        for _ in range(blocks_for(seq.num_tokens, self.block_size) - len(hits)):
            seq.block_table.append(self._take_free(seq.block_table[-1] if seq.block_table else None))
        seq.num_computed_tokens = len(hits) * self.block_size
        if not seq.admitted:
            seq.num_cached_tokens = seq.num_computed_tokens
            seq.admitted = True
        seq.num_sealed_blocks = len(hits)
        self.prefix_query_tokens += seq.num_tokens
        self.prefix_hit_tokens += seq.num_computed_tokens

    def seal(self, seq: Sequence) -> None:
        """Key seq's blocks that have become full of computed K/V, so later prompts can share them.

        A block whose key another block already has stays private (two prompts that computed the
        same prefix at once): one copy in the cache is enough."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        self._extend_hashes(seq, full)
        for i in range(seq.num_sealed_blocks, full):
            key = seq.block_hashes[i]
            if key not in self._by_hash:
                parent = seq.block_hashes[i - 1] if i else seq.prefix_root
                tokens = tuple(seq.token_ids(i * self.block_size, (i + 1) * self.block_size))
                block = seq.block_table[i]
                self._keys[block] = _BlockKey(key, parent, tokens)
                self._by_hash[key] = block
        seq.num_sealed_blocks = max(seq.num_sealed_blocks, full)

    def free(self, seq: Sequence) -> None:
        """seq lets go of its blocks; each returns to the pool once its last user has let go.

        Released last block first, so a sequence's tail is evicted before its head (the head, a
        system prompt or an earlier turn, is what the next request most likely shares)."""
        for block in reversed(seq.block_table):
            self._refs[block] -= 1
            if self._refs[block] < 0:
                raise RuntimeError(f"block {block} released more often than taken")
            if self._refs[block] == 0:
                if self._keys[block] is None:
                    self._empty[block] = True
                    self._num_empty += 1
                else:
                    self._cached[block] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_sealed_blocks = 0

    def can_allocate_after(self, seq: Sequence, others: Iterable[Sequence]) -> bool:
        """Whether seq could be admitted once all of `others` let go of their blocks.

        Their blocks no one else holds would become free, but those that are seq's cache hits would
        go straight back to seq (a hit nobody holds costs a free block, one held costs none): with
        the prefix cache shared, preempting a sequence whose prefix the newcomer shares gains only
        the blocks beyond that prefix."""
        held: dict[int, int] = {}
        for other in others:
            for block in other.block_table:
                held[block] = held.get(block, 0) + 1
        released = {block for block, n in held.items() if self._refs[block] == n}
        hits = self._match(seq)
        fresh = blocks_for(seq.num_tokens, self.block_size) - len(hits)
        cost = fresh + sum(1 for b in hits if self._refs[b] == 0 or b in released)
        return cost <= self.num_free_blocks + len(released)

    def _take_free(self, after: int | None) -> int:
        """A free block for a sequence whose table ends with block `after` (None: it holds none)."""
        if self._num_empty:
            block = self._next_empty(after)
            self._empty[block] = False
            self._num_empty -= 1
        else:
            block, _ = self._cached.popitem(last=False)
            key = self._keys[block]
            assert key is not None
            del self._by_hash[key.hash]
            self._keys[block] = None
        self._refs[block] = 1
        return block

    def _next_empty(self, after: int | None) -> int:
        """The block after `after` if it is empty, else one where a new run of blocks can grow."""
        if after is not None and after + 1 < self.num_blocks and self._empty[after + 1]:
            return after + 1
        edges = np.flatnonzero(np.diff(self._empty.astype(np.int8), prepend=0, append=0))
        starts, stops = edges[0::2], edges[1::2]
        longest = int(np.argmax(stops - starts))
        start, stop = int(starts[longest]), int(stops[longest])
        if start == 0 or self._refs[start - 1] == 0:
            return start
        return start + (stop - start) // 2

    def _match(self, seq: Sequence) -> list[int]:
        """The blocks holding seq's longest cached prefix of full blocks, its last token excluded."""
        if not self.enable_prefix_caching:
            return []
        limit = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, limit)
        hits: list[int] = []
        for i in range(limit):
            block = self._by_hash.get(seq.block_hashes[i])
            if block is None:
                break
            key = self._keys[block]
            parent = seq.block_hashes[i - 1] if i else seq.prefix_root
            tokens = tuple(seq.token_ids(i * self.block_size, (i + 1) * self.block_size))
            if key is None or key.parent != parent or key.tokens != tokens:
                break
            hits.append(block)
        return hits

    def _extend_hashes(self, seq: Sequence, count: int) -> None:
        """Make sure seq.block_hashes has the keys of its first count full blocks (computed once:
        a sequence's tokens never change, only grow)."""
        hashes = seq.block_hashes
        while len(hashes) < count:
            i = len(hashes)
            parent = hashes[-1] if hashes else seq.prefix_root
            hashes.append(chain_hash(parent, seq.token_ids(i * self.block_size, (i + 1) * self.block_size)))
