"""Prefix caching in the scheduler and block manager, under random interleavings of add, step,
cancel and preempt (hypothesis drives them) on a pool small enough to evict and preempt.

Besides the block accounting, a fake KV cache records, for every slot a step writes, which position
of which token prefix it holds; every step then checks that each scheduled sequence reads exactly
its own prefix's K/V, shared blocks included, and never writes into a block another sequence holds.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu_container.engine.block_manager import BlockManager, blocks_for
from gpu_container.engine.prefix_hash import block_hashes
from gpu_container.engine.scheduler import ScheduledChunk, Scheduler
from gpu_container.engine.sequence import Sequence, SequenceStatus
from gpu_container.engine.types import EngineConfig, SamplingParams

BLOCK = 4
# Prompts start with one of these, so sequences share (and miss) prefixes at every block boundary.
PREFIXES: tuple[list[int], ...] = ([7] * 9, [7] * 8 + [3, 3, 3, 3, 5], [9, 1, 9, 1, 9, 1, 9, 1], [])

Slot = tuple[int, tuple[int, ...]]  # (position, the tokens up to and including it)


def _next_token(seq: Sequence) -> int:
    """A deterministic stand-in for the model: the same context always yields the same token."""
    return (sum(seq.prompt_ids) * 31 + len(seq.output_ids) * 7 + seq.num_tokens) % 11 + 2


class PrefixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.config = EngineConfig(
            block_size=BLOCK, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=9, max_model_len=40
        )
        self.blocks = BlockManager(self.config.num_blocks, BLOCK, enable_prefix_caching=True)
        self.scheduler = Scheduler(self.config, self.blocks)
        self.kv: dict[int, Slot] = {}  # slot -> what the fake forward wrote there
        self.live: list[Sequence] = []
        self.count = 0

    @initialize()
    def start(self) -> None:
        assert self.blocks.num_free_blocks == self.config.num_blocks

    def _add(self, prompt: list[int], max_new: int, priority: int) -> None:
        params = SamplingParams(max_new_tokens=max_new, temperature=0)
        seq = Sequence(f"r{self.count}", prompt, params, lambda _: None, priority, self.count)
        self.count += 1
        self.scheduler.add(seq)
        self.live.append(seq)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(2, 6), max_size=7),
        max_new=st.integers(1, 9),
        priority=st.integers(0, 1),
    )
    def add(self, prefix: list[int], suffix: list[int], max_new: int, priority: int) -> None:
        prompt = prefix + suffix
        self._add(prompt or [2], max_new, priority)

    @rule(prefix=st.sampled_from(PREFIXES[:3]))
    def preempt(self, prefix: list[int]) -> None:
        """A higher-priority prompt that needs most of the pool: lower-priority sequences make room."""
        self._add(prefix + [4] * (36 - len(prefix)), 2, priority=5)

    @precondition(lambda self: bool(self.live))
    @rule(index=st.integers(0, 100))
    def cancel(self, index: int) -> None:
        seq = self.live.pop(index % len(self.live))
        self.scheduler.remove(seq)

    @rule(steps=st.integers(1, 4))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            chunks = self.scheduler.schedule()
            assert sum(c.num_tokens for c in chunks) <= self.config.max_num_batched_tokens
            self._check_blocks()
            completing = [c.seq for c in chunks if c.completes]
            for chunk in chunks:
                self._forward(chunk)
            self.scheduler.advance(chunks)
            for seq in completing:
                seq.output_ids.append(_next_token(seq))
                if len(seq.output_ids) >= seq.params.max_new_tokens or seq.num_tokens >= 40:
                    self.scheduler.remove(seq)
                    self.live.remove(seq)

    def _forward(self, chunk: ScheduledChunk) -> None:
        seq, start = chunk.seq, chunk.seq.num_computed_tokens
        tokens = seq.token_ids(0, start + chunk.num_tokens)
        for pos in range(start + chunk.num_tokens):
            block = seq.block_table[pos // BLOCK]
            slot = block * BLOCK + pos % BLOCK
            if pos < start:  # read: the K/V attention sees must be this sequence's own prefix
                assert self.kv.get(slot) == (pos, tuple(tokens[: pos + 1])), (seq.request_id, pos)
            else:  # write: only into a block nobody else holds
                assert self.blocks.ref_count(block) == 1, (seq.request_id, pos, block)
                self.kv[slot] = (pos, tuple(tokens[: pos + 1]))

    def _check_blocks(self) -> None:
        held = Counter(b for seq in self.scheduler.running for b in seq.block_table)
        free = self.blocks.free_block_ids()
        assert len(free) == len(set(free)) == self.blocks.num_free_blocks
        assert not held.keys() & set(free), "a block is free while a sequence holds it"
        assert set(held) | set(free) == set(range(self.config.num_blocks)), "a block leaked"
        for block in range(self.config.num_blocks):
            assert self.blocks.ref_count(block) == held[block]
        for seq in self.scheduler.running:
            table = seq.block_table
            assert len(table) == len(set(table))
            assert len(table) >= blocks_for(seq.num_tokens, BLOCK)
            # Only blocks wholly computed may be shared; the one being filled is private.
            for block in table[seq.num_computed_tokens // BLOCK :]:
                assert self.blocks.ref_count(block) == 1
        for seq in self.scheduler.waiting:
            assert not seq.block_table and seq.num_computed_tokens == 0

    @invariant()
    def hit_counts_are_sane(self) -> None:
        assert 0 <= self.blocks.prefix_hit_tokens <= self.blocks.prefix_query_tokens
        assert self.blocks.num_cached_blocks <= self.blocks.num_free_blocks

    def teardown(self) -> None:
        for seq in self.live:
            self.scheduler.remove(seq)
        assert not self.scheduler.has_work()
        assert self.blocks.num_free_blocks == self.config.num_blocks, (
            "blocks leaked after every sequence ended"
        )
        assert all(self.blocks.ref_count(b) == 0 for b in range(self.config.num_blocks))
        assert all(seq.status is SequenceStatus.FINISHED for seq in self.live)


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


def _admit_alone(blocks: BlockManager, prompt: list[int]) -> Sequence:
    seq = Sequence("s", prompt, SamplingParams(), lambda _: None)
    blocks.allocate(seq)
    return seq


def _compute_all(blocks: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = seq.num_tokens
    blocks.seal(seq)


def test_a_shared_prefix_is_computed_once_and_the_last_token_always_recomputed() -> None:
    blocks = BlockManager(8, BLOCK, enable_prefix_caching=True)
    first = _admit_alone(blocks, list(range(2, 14)))  # three full blocks
    assert first.num_computed_tokens == 0
    _compute_all(blocks, first)
    second = _admit_alone(blocks, [*list(range(2, 14)), 50, 51])
    assert second.num_computed_tokens == 12 and second.block_table[:3] == first.block_table
    third = _admit_alone(blocks, list(range(2, 14)))  # fully cached: its last block is recomputed
    assert third.num_computed_tokens == 8 and third.block_table[:2] == first.block_table[:2]
    assert third.block_table[2] != first.block_table[2]
    assert blocks.prefix_hit_tokens == 20 and blocks.prefix_query_tokens == 12 + 14 + 12


def test_released_prefixes_stay_cached_and_are_evicted_least_recently_used_first() -> None:
    blocks = BlockManager(6, BLOCK, enable_prefix_caching=True)
    old, new = [3] * 8 + [1], [5] * 8 + [1]
    for prompt in (old, new):
        seq = _admit_alone(blocks, prompt)
        _compute_all(blocks, seq)
        blocks.free(seq)
    # Each keeps its two full blocks; the partial third went back empty.
    assert blocks.num_free_blocks == 6 and blocks.num_cached_blocks == 4
    takers = [_admit_alone(blocks, [9] * 5), _admit_alone(blocks, [8])]  # empty blocks go first
    assert blocks.num_cached_blocks == 3  # then the least recently released: the old prompt's tail
    for seq in takers:
        blocks.free(seq)
    assert _admit_alone(blocks, old).num_computed_tokens == 4
    assert _admit_alone(blocks, new).num_computed_tokens == 8


def test_a_readmission_after_preemption_reports_the_first_admissions_cache_hits() -> None:
    """The usage's cached_tokens is what the prefix cache spared the request: a sequence preempted
    mid-prefill finds its own blocks on readmission, computed for it, and reported them as cached
    (a 60-token prompt nobody shared said 24 in a review)."""
    blocks = BlockManager(8, BLOCK, enable_prefix_caching=True)
    seq = _admit_alone(blocks, list(range(2, 14)))
    assert seq.num_cached_tokens == 0
    _compute_all(blocks, seq)
    blocks.free(seq)  # preempted: recomputed from what the cache still holds of it
    blocks.allocate(seq)
    assert seq.num_computed_tokens == 8  # its own blocks spare the recompute
    assert seq.num_cached_tokens == 0


def test_caching_off_shares_nothing() -> None:
    blocks = BlockManager(8, BLOCK, enable_prefix_caching=False)
    seq = _admit_alone(blocks, [3] * 9)
    _compute_all(blocks, seq)
    blocks.free(seq)
    assert blocks.num_cached_blocks == 0
    assert _admit_alone(blocks, [3] * 9).num_computed_tokens == 0


def test_a_hash_collision_is_a_miss_not_someone_elses_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_container.engine.block_manager as bm

    monkeypatch.setattr(bm, "chain_hash", lambda parent, tokens: 42)  # every block collides
    blocks = BlockManager(8, BLOCK, enable_prefix_caching=True)
    _compute_all(blocks, _admit_alone(blocks, [3] * 5))
    assert _admit_alone(blocks, [4] * 5).num_computed_tokens == 0


@given(tokens=st.lists(st.integers(0, 50_000), max_size=40), size=st.integers(1, 8))
def test_block_hashes_chain_the_whole_prefix(tokens: list[int], size: int) -> None:
    hashes = block_hashes(tokens, size)
    assert len(hashes) == len(tokens) // size
    assert block_hashes([*tokens, 1], size)[: len(hashes)] == hashes
    if hashes:
        changed = [tokens[0] + 1, *tokens[1:]]
        assert not set(block_hashes(changed, size)) & set(hashes)
