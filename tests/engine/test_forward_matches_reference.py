"""The paged, batched, chunked forward gives the logits of a plain full recompute, for sequences of
different lengths joining and leaving mid-batch, split into prefill chunks and preempted."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.scheduler import Scheduler
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import EngineConfig, SamplingParams
from tests.engine.reference_llama import reference_logits
from tests.engine.tiny_llama import tiny_model

# (step it joins at, prompt length, tokens it generates before leaving)
PLAN = [(0, 13, 6), (0, 3, 9), (1, 1, 5), (2, 21, 4), (4, 6, 12), (7, 2, 3), (9, 17, 5), (12, 30, 2)]


@pytest.mark.parametrize("knee_rows", [1, 3, 16], ids=lambda k: f"knee-{k}")
@pytest.mark.parametrize("tied", [False, True], ids=["untied-lm-head", "tied-lm-head"])
def test_paged_batched_forward_matches_full_recompute(tied: bool, knee_rows: int) -> None:
    """Whatever the GEMV/GEMM knee (batches here have 1-9 rows: both sides of a knee of 3)."""
    model, tensors = tiny_model(tie_word_embeddings=tied)
    model.knee_rows = knee_rows
    mc = model.config
    config = EngineConfig(
        block_size=4, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=9, max_model_len=56
    )
    blocks = BlockManager(config.num_blocks, config.block_size)
    scheduler = Scheduler(config, blocks)
    cache = KVCache.allocate(
        mc.num_hidden_layers, config.num_blocks, config.block_size, mc.num_key_value_heads, mc.head_dim
    )
    rng = np.random.default_rng(7)
    # Tokens are scripted (teacher forcing), so the comparison does not hinge on sampling.
    script: dict[str, list[int]] = {}
    seqs: list[tuple[int, Sequence]] = []
    for i, (join, prompt_len, generate) in enumerate(PLAN):
        prompt = rng.integers(0, mc.vocab_size, prompt_len).tolist()
        seq = Sequence(f"s{i}", prompt, SamplingParams(temperature=0), lambda _: None, arrival=i)
        script[seq.request_id] = rng.integers(0, mc.vocab_size, generate).tolist()
        seqs.append((join, seq))

    compared = partial_chunks = mixed_steps = 0
    finished = set()
    for step in range(500):
        for join, seq in seqs:
            if join == step:
                scheduler.add(seq)
        if not scheduler.has_work() and step > max(j for j, _ in seqs):
            break
        chunks = scheduler.schedule()
        partial_chunks += sum(1 for c in chunks if not c.completes)
        mixed_steps += any(c.num_tokens == 1 for c in chunks) and any(c.num_tokens > 1 for c in chunks)
        logits = model.forward(ForwardBatch.from_chunks(chunks, config.block_size), cache)
        completing = [c.seq for c in chunks if c.completes]
        scheduler.advance(chunks)
        assert logits.shape == (len(completing), mc.vocab_size)
        for seq, row in zip(completing, logits, strict=True):
            expected = reference_logits(mc, tensors, seq.prompt_ids + seq.output_ids)
            np.testing.assert_allclose(row, expected, rtol=1e-4, atol=1e-4)
            compared += 1
            pending = script[seq.request_id]
            seq.output_ids.append(pending[len(seq.output_ids)])
            if len(seq.output_ids) == len(pending):
                scheduler.remove(seq)
                finished.add(seq.request_id)

    assert finished == set(script)
    assert compared >= sum(g for _, _, g in PLAN)
    # The scenario really exercised what it claims to.
    assert partial_chunks > 0 and mixed_steps > 0 and scheduler.num_preemptions > 0
    assert blocks.num_free_blocks == config.num_blocks
