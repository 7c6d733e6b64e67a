"""The block manager hands a sequence's blocks out consecutively where the pool allows, so attention
can read a context through a few views of the pool (attention.py) instead of gathering it."""

from __future__ import annotations

import numpy as np

from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import SamplingParams

BLOCK = 4


def _seq(name: str, tokens: list[int]) -> Sequence:
    return Sequence(name, tokens, SamplingParams(), lambda _: None)


def _runs(table: list[int]) -> int:
    return 1 + int(np.count_nonzero(np.diff(table) != 1)) if table else 0


def test_sequences_growing_side_by_side_each_keep_one_run() -> None:
    blocks = BlockManager(64, BLOCK)
    seqs = [_seq(f"s{i}", [1, 2, 3]) for i in range(4)]
    for seq in seqs:
        blocks.allocate(seq)
    for tokens in range(4, 41):  # they grow in turn, a block each every BLOCK tokens
        for seq in seqs:
            blocks.reserve(seq, tokens)
    assert [len(s.block_table) for s in seqs] == [10] * 4
    assert [_runs(s.block_table) for s in seqs] == [1] * 4
    assert len({b for s in seqs for b in s.block_table}) == 40


def test_a_new_run_starts_mid_gap_when_the_block_before_it_is_held() -> None:
    blocks = BlockManager(16, BLOCK)
    first, second = _seq("first", [1] * 8), _seq("second", [2] * 8)
    blocks.allocate(first)
    blocks.allocate(second)
    assert first.block_table == [0, 1]
    assert second.block_table == [9, 10]  # the middle of the empty run 2..15: first can still grow
    blocks.free(first)
    third = _seq("third", [3] * 4)
    blocks.allocate(third)
    assert third.block_table == [0]  # nobody holds a block before 0


def test_a_prefix_hit_is_followed_by_fresh_blocks_after_it_when_empty() -> None:
    blocks = BlockManager(32, BLOCK, enable_prefix_caching=True)
    shared = [5] * 8
    first = _seq("first", [*shared, 1])
    blocks.allocate(first)
    first.num_computed_tokens = first.num_tokens
    blocks.seal(first)
    blocks.free(first)  # its two full blocks stay cached, its last one is empty again
    second = _seq("second", [*shared, *range(10, 20)])
    blocks.allocate(second)
    assert second.num_cached_tokens == 8
    assert second.block_table[:2] == [0, 1]
    assert _runs(second.block_table) == 1


def test_a_full_pool_still_hands_out_every_block() -> None:
    blocks = BlockManager(8, BLOCK)
    seqs = [_seq(f"s{i}", [1] * 5) for i in range(4)]  # two blocks each: the pool is full
    for seq in seqs:
        blocks.allocate(seq)
    assert sorted(b for s in seqs for b in s.block_table) == list(range(8))
    assert blocks.num_free_blocks == 0
    blocks.free(seqs[1])
    blocks.reserve(seqs[0], 9)
    assert blocks.num_free_blocks == 1
