"""Thousands of random adds, finishes and aborts against the scheduler and the block manager on a
tiny pool: every step keeps the pool an exact partition, and at the end every block is free."""

from __future__ import annotations

import numpy as np

from gpu_container.engine.block_manager import BlockManager, blocks_for
from gpu_container.engine.scheduler import Scheduler
from gpu_container.engine.sequence import Sequence, SequenceStatus
from gpu_container.engine.types import EngineConfig, SamplingParams


def _check_partition(scheduler: Scheduler, blocks: BlockManager, config: EngineConfig) -> None:
    owned = [b for seq in scheduler.running for b in seq.block_table]
    assert len(owned) == len(set(owned)), "two live sequences share a block"
    assert all(not seq.block_table for seq in scheduler.waiting), "a waiting sequence holds blocks"
    free = blocks.free_block_ids()
    assert len(free) == len(set(free))
    assert sorted(owned + list(free)) == list(range(config.num_blocks))


def test_random_churn_never_shares_or_leaks_blocks() -> None:
    config = EngineConfig(
        block_size=4, num_blocks=12, max_num_seqs=5, max_num_batched_tokens=10, max_model_len=48
    )
    blocks = BlockManager(config.num_blocks, config.block_size)
    scheduler = Scheduler(config, blocks)
    rng = np.random.default_rng(3)
    live: list[Sequence] = []
    added = finished = aborted = 0
    for _ in range(4000):
        for _ in range(rng.poisson(0.4)):
            prompt = [1] * int(rng.integers(1, 30))
            params = SamplingParams(max_new_tokens=int(rng.integers(1, 16)), temperature=0)
            seq = Sequence(f"r{added}", prompt, params, lambda _: None, int(rng.integers(0, 3)), added)
            scheduler.add(seq)
            live.append(seq)
            added += 1
        if live and rng.random() < 0.15:
            victim = live.pop(int(rng.integers(0, len(live))))
            scheduler.remove(victim)
            aborted += 1
        chunks = scheduler.schedule()
        assert sum(c.num_tokens for c in chunks) <= config.max_num_batched_tokens
        assert len(scheduler.running) <= config.max_num_seqs
        for chunk in chunks:
            end = chunk.seq.num_computed_tokens + chunk.num_tokens
            assert len(chunk.seq.block_table) >= blocks_for(end, config.block_size)
        _check_partition(scheduler, blocks, config)
        completing = [c.seq for c in chunks if c.completes]
        scheduler.advance(chunks)
        for seq in completing:
            seq.output_ids.append(2)
            if len(seq.output_ids) >= seq.params.max_new_tokens or seq.num_tokens >= config.max_model_len:
                scheduler.remove(seq)
                live.remove(seq)
                finished += 1
    for seq in live:
        scheduler.remove(seq)
    assert added > 1000 and finished > 500 and aborted > 300
    assert scheduler.num_preemptions > 0
    assert not scheduler.has_work()
    assert all(seq.status is SequenceStatus.FINISHED for seq in live)
    assert blocks.num_free_blocks == config.num_blocks


def test_waiting_queue_is_ordered_by_priority_then_arrival() -> None:
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=1, max_num_batched_tokens=64)
    scheduler = Scheduler(config, BlockManager(config.num_blocks, config.block_size))
    for arrival, priority in enumerate([0, 5, 0, 10, 5]):
        scheduler.add(
            Sequence(f"p{priority}-a{arrival}", [1, 2], SamplingParams(), lambda _: None, priority, arrival)
        )
    order = []
    while scheduler.has_work():
        (chunk,) = scheduler.schedule()
        order.append(chunk.seq.request_id)
        scheduler.remove(chunk.seq)
    assert order == ["p10-a3", "p5-a1", "p5-a4", "p0-a0", "p0-a2"]
