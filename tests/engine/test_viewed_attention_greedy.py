"""Reading contexts through views of the pool (attention.py) changes no greedy token: the same
chunked, batched generation with every context gathered block by block gives the same ids."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import gpu_container.engine.attention as attention
from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.forward_batch import ForwardBatch, SequenceSlice
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.scheduler import Scheduler
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import EngineConfig, SamplingParams
from tests.engine.tiny_llama import tiny_model

BLOCK = 4


def _generate(viewed_steps: list[int]) -> tuple[list[list[int]], list[float]]:
    """Greedy ids of three long prompts decoded side by side, and every logits row's maximum."""
    model, _ = tiny_model()
    mc = model.config
    config = EngineConfig(
        block_size=BLOCK, num_blocks=200, max_num_seqs=4, max_num_batched_tokens=48, max_model_len=400
    )
    scheduler = Scheduler(config, BlockManager(config.num_blocks, BLOCK))
    cache = KVCache.allocate(
        mc.num_hidden_layers, config.num_blocks, BLOCK, mc.num_key_value_heads, mc.head_dim
    )
    rng = np.random.default_rng(11)
    seqs = [
        Sequence(
            f"s{i}", rng.integers(2, mc.vocab_size, n).tolist(), SamplingParams(), lambda _: None, arrival=i
        )
        for i, n in enumerate((260, 150, 90))
    ]
    for seq in seqs:
        scheduler.add(seq)
    maxima: list[float] = []
    while any(len(s.output_ids) < 24 for s in seqs):
        chunks = scheduler.schedule()
        batch = ForwardBatch.from_chunks(chunks, BLOCK)
        viewed_steps.append(len(attention.AttentionPlan.build(batch.slices, BLOCK).viewed))
        logits = model.forward(batch, cache)
        for seq, row in zip(scheduler.advance(chunks), logits, strict=True):
            maxima.append(float(row.max()))
            seq.output_ids.append(int(np.argmax(row)))
    return [s.output_ids[:24] for s in seqs], maxima


def _block_by_block(s: SequenceSlice, block_size: int) -> tuple[tuple[int, int], ...]:
    """As if no two blocks of a table were adjacent in the pool: every context is gathered."""
    starts = [*range(0, s.context_len, block_size), s.context_len]
    return tuple(
        (int(s.block_table[a // block_size]) * block_size, b - a) for a, b in itertools.pairwise(starts)
    )


def test_views_and_gathering_give_the_same_greedy_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    viewed: list[int] = []
    ids, maxima = _generate(viewed)
    assert sum(viewed) > 0  # the long contexts were read through views
    monkeypatch.setattr(attention, "_runs", _block_by_block)
    gathered: list[int] = []
    ids_gathered, maxima_gathered = _generate(gathered)
    assert ids == ids_gathered
    np.testing.assert_allclose(maxima, maxima_gathered, rtol=1e-5)
    assert sum(gathered) < sum(viewed)
