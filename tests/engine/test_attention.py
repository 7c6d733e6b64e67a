"""Paged attention against a plain per-sequence softmax(q k^T) v, for decodes of very different
context lengths (batched short and long apart) and for prefill chunks after a cached prefix."""

from __future__ import annotations

import numpy as np

from gpu_container.engine.arrays import Floats
from gpu_container.engine.attention import AttentionPlan, paged_attention
from gpu_container.engine.forward_batch import SequenceSlice

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 8, 4


def _plain(q: Floats, k: Floats, v: Floats, first_pos: int) -> Floats:
    """q [n, heads, hd] at positions first_pos.., k/v [ctx, kv_heads, hd]: causal attention."""
    group = HEADS // KV_HEADS
    out = np.empty_like(q)
    for h in range(HEADS):
        scores = q[:, h] @ k[:, h // group].T / np.sqrt(HEAD_DIM)
        future = np.arange(len(k))[None, :] > first_pos + np.arange(len(q))[:, None]
        scores[future] = -np.inf
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[:, h] = (p / p.sum(axis=-1, keepdims=True)) @ v[:, h // group]
    return out


def test_decodes_of_short_and_long_contexts_and_a_chunk_match_plain_attention() -> None:
    rng = np.random.default_rng(3)
    blocks = 64
    keys = rng.standard_normal((blocks, BLOCK, KV_HEADS, HEAD_DIM)).astype(np.float32)
    values = rng.standard_normal((blocks, BLOCK, KV_HEADS, HEAD_DIM)).astype(np.float32)
    # Three short decodes, one with a 150-token context, then a 6-token chunk after 21 cached tokens.
    tables = [rng.permutation(blocks)[: -(-ctx // BLOCK)] for ctx in (5, 9, 3, 150, 27)]
    contexts = [5, 9, 3, 150, 27]
    lengths = [1, 1, 1, 1, 6]
    starts = np.cumsum([0, *lengths[:-1]])
    slices = tuple(
        SequenceSlice(int(st), n, ctx, t.astype(np.int64))
        for st, n, ctx, t in zip(starts, lengths, contexts, tables, strict=True)
    )
    plan = AttentionPlan.build(slices, BLOCK)
    assert [len(d.rows) for d in plan.decodes] == [3, 1]  # the long one is batched apart
    q = rng.standard_normal((sum(lengths), HEADS, HEAD_DIM)).astype(np.float32)
    got = paged_attention(q, keys, values, plan, 1 / np.sqrt(HEAD_DIM))
    for s in slices:
        k = keys[s.block_table].reshape(-1, KV_HEADS, HEAD_DIM)[: s.context_len]
        v = values[s.block_table].reshape(-1, KV_HEADS, HEAD_DIM)[: s.context_len]
        rows = slice(s.start, s.start + s.length)
        expected = _plain(q[rows], k, v, s.context_len - s.length)
        np.testing.assert_allclose(got[rows], expected, rtol=1e-4, atol=1e-5)


def test_decodes_of_similar_contexts_stay_one_batch() -> None:
    slices = tuple(
        SequenceSlice(i, 1, ctx, np.arange(-(-ctx // BLOCK))) for i, ctx in enumerate((20, 24, 31))
    )
    assert len(AttentionPlan.build(slices, BLOCK).decodes) == 1
