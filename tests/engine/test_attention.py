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
    _assert_matches_plain(got, q, keys, values, slices)


def test_decodes_of_similar_contexts_stay_one_batch() -> None:
    slices = tuple(
        SequenceSlice(i, 1, ctx, np.arange(-(-ctx // BLOCK))) for i, ctx in enumerate((20, 24, 31))
    )
    assert len(AttentionPlan.build(slices, BLOCK).decodes) == 1


def test_contexts_in_a_few_runs_of_blocks_are_read_through_views_and_match_plain_attention() -> None:
    rng = np.random.default_rng(5)
    blocks = 256
    keys = rng.standard_normal((blocks, BLOCK, KV_HEADS, HEAD_DIM)).astype(np.float32)
    values = rng.standard_normal((blocks, BLOCK, KV_HEADS, HEAD_DIM)).astype(np.float32)
    one_run = np.arange(10, 10 + 50)  # a 198-token decode: one run
    two_runs = np.concatenate([np.arange(100, 140), np.arange(70, 95)])  # a 259-token decode
    chunk_runs = np.concatenate([np.arange(150, 200), np.arange(200 + 5, 200 + 40)])  # a 7-token chunk
    fragmented = rng.permutation(np.arange(0, 10))[:8]  # a 30-token chunk scattered block by block
    cases = [(one_run, 198, 1), (two_runs, 259, 1), (chunk_runs, 340, 7), (fragmented, 30, 5)]
    starts = np.cumsum([0, *(n for _, _, n in cases[:-1])])
    slices = tuple(
        SequenceSlice(int(st), n, ctx, table.astype(np.int64))
        for st, (table, ctx, n) in zip(starts, cases, strict=True)
    )
    plan = AttentionPlan.build(slices, BLOCK)
    assert [len(w.runs) for w in plan.viewed] == [1, 2, 2]
    assert [p.slice.length for p in plan.prefills] == [5]  # the scattered one is gathered
    q = rng.standard_normal((sum(n for _, _, n in cases), HEADS, HEAD_DIM)).astype(np.float32)
    got = paged_attention(q, keys, values, plan, 1 / np.sqrt(HEAD_DIM))
    _assert_matches_plain(got, q, keys, values, slices)


def test_short_decodes_stay_in_the_gathered_batch() -> None:
    slices = tuple(SequenceSlice(i, 1, 40, np.arange(i * 10, i * 10 + 10)) for i in range(3))
    plan = AttentionPlan.build(slices, BLOCK)
    assert not plan.viewed and [len(d.rows) for d in plan.decodes] == [3]


def _assert_matches_plain(
    got: Floats, q: Floats, keys: Floats, values: Floats, slices: tuple[SequenceSlice, ...]
) -> None:
    """Each slice's rows of `got` equal plain attention over its context, gathered from the pool."""
    for s in slices:
        k = keys[s.block_table].reshape(-1, KV_HEADS, HEAD_DIM)[: s.context_len]
        v = values[s.block_table].reshape(-1, KV_HEADS, HEAD_DIM)[: s.context_len]
        rows = slice(s.start, s.start + s.length)
        expected = _plain(q[rows], k, v, s.context_len - s.length)
        np.testing.assert_allclose(got[rows], expected, rtol=1e-4, atol=1e-5)
