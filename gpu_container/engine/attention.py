"""Grouped-query attention reading K/V through block tables of the paged cache.

A plan is built once per step (the block tables and masks are the same in every layer): decodes,
one query each, are batched over tables padded to the longest; prefill chunks run one by one, each
query attending causally to its sequence's cached prefix and to the chunk itself.

A sequence whose table is a few runs of consecutive blocks (the block manager hands them out that
way where it can) is read through views of the pool, one per run, instead of gathering its whole
context with `keys[table]` every layer of every step: a copy of context x kv_heads x head_dim
floats for K and again for V, which late in a 2,000-token prompt was a large part of what a step
spent on attention (docs/bench-engine.md). Each run's scores go into one row of scores over the
whole context, the softmax runs over that row once, and each run's slice of it multiplies that
run's V: the same arithmetic as over a gathered context, without the copies. Short decodes still go
through the gathered batch: at a few dozen keys the copy is cheap, and one batched product for all
of them costs less Python than a loop over them; a fragmented table too (a run per block or two
would cost more in per-run calls than the copy saves).

When a few decodes have far longer contexts than the rest (the reply to a 2,000-token prompt next
to short chats), padding every table to the longest made each short decode gather and score 2,000
keys: the decodes are then split into two batches, short and long, when that at least halves the
padded area (a decode step of 4 short streams and one 2,000-token one measured 338 ms of CPU time
padded, against 85 ms without the long one).

A prefill chunk's scores are [heads, chunk, context]: late in a long prompt that array is the
largest thing a step touches, so it is passed over as few times as possible (measured in
docs/bench-engine.md: a 32-token chunk at 2,000 tokens of context spent more time here than in
its projections). The scale goes on the queries, the causal mask only on the chunk's own keys (the
cached prefix is visible to every query), the softmax runs in place, and it is normalised after the
product with V, on [heads, chunk, head_dim] instead of [heads, chunk, context].
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from gpu_container.engine.arrays import Floats, Ints
from gpu_container.engine.forward_batch import SequenceSlice


@dataclass(frozen=True, slots=True)
class _Decodes:
    rows: Ints  # rows of the flat batch
    tables: Ints  # [B, width] block ids, padded with block 0
    bias: Floats  # [B, width * block_size]: 0 for real keys, -inf for padding


@dataclass(frozen=True, slots=True)
class _Prefill:
    slice: SequenceSlice
    bias: Floats  # [chunk, chunk]: the mask over the chunk's own keys, -inf in a query's future


@dataclass(frozen=True, slots=True)
class _Viewed:
    """A decode or a prefill chunk whose context is read through views of the pool."""

    slice: SequenceSlice
    runs: tuple[tuple[int, int], ...]  # (first pool slot, keys): the context, run by run
    bias: Floats | None  # the chunk's causal mask, as _Prefill's; None for a decode


# A decode is read through views from this many keys of context on (below it, the batched gather
# costs less than a loop over the decodes), and any sequence only if its runs average at least
# this many keys.
VIEW_MIN_KEYS = 128
# A decode (one query token) read through views takes matrix-vector products from this many keys
# on (_attend_one); below it the batched product's fewer calls cost less. 30 layers of SmolLM2, K/V
# not in the cache, AMD EPYC: 128 keys 3.0 ms batched against 3.4 as GEMVs, 256 keys 5.9 against
# 4.7, 2,000 keys 41.6 against 22.8.
GEMV_MIN_KEYS = 192


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    decodes: tuple[_Decodes, ...]
    prefills: tuple[_Prefill, ...]
    viewed: tuple[_Viewed, ...] = ()

    @classmethod
    def build(cls, slices: tuple[SequenceSlice, ...], block_size: int) -> AttentionPlan:
        viewed: list[_Viewed] = []
        gathered: list[SequenceSlice] = []
        for s in slices:
            runs = _runs(s, block_size)
            if len(runs) * VIEW_MIN_KEYS <= max(s.context_len, VIEW_MIN_KEYS if s.length > 1 else 0):
                viewed.append(_Viewed(s, runs, _causal(s.length) if s.length > 1 else None))
            else:
                gathered.append(s)
        decoding = sorted((s for s in gathered if s.length == 1), key=lambda s: len(s.block_table))
        split = _split(decoding)
        groups = [g for g in (decoding[:split], decoding[split:]) if g]
        decodes = tuple(_batch(group, block_size) for group in groups)
        prefills = tuple(_Prefill(s, _causal(s.length)) for s in gathered if s.length > 1)
        return cls(decodes, prefills, tuple(viewed))


def _causal(length: int) -> Floats:
    future = np.arange(length)[None, :] > np.arange(length)[:, None]
    return np.where(future, -np.inf, 0.0).astype(np.float32)


def _runs(s: SequenceSlice, block_size: int) -> tuple[tuple[int, int], ...]:
    """The slice's context as (first pool slot, keys) runs of consecutive blocks."""
    table = s.block_table
    starts = [0, *(np.flatnonzero(np.diff(table) != 1) + 1).tolist(), len(table)]
    runs = []
    for first, stop in itertools.pairwise(starts):
        keys = min(stop * block_size, s.context_len) - first * block_size
        runs.append((int(table[first]) * block_size, keys))
    return tuple(runs)


def _split(decoding: list[SequenceSlice]) -> int:
    """Where to cut the decodes (sorted by table width) into a short and a long batch: the cut
    that pads the least, if it at least halves the padded area of one batch; else no cut."""
    widths = [len(s.block_table) for s in decoding]
    n = len(widths)
    if n < 2:
        return n
    area = {i: i * widths[i - 1] + (n - i) * widths[-1] for i in range(1, n)}
    cut = min(area, key=lambda i: area[i])
    return cut if 2 * area[cut] <= n * widths[-1] else n


def _batch(decoding: list[SequenceSlice], block_size: int) -> _Decodes:
    width = max(len(s.block_table) for s in decoding)
    tables = np.zeros((len(decoding), width), dtype=np.int64)
    for i, s in enumerate(decoding):
        tables[i, : len(s.block_table)] = s.block_table
    context = np.array([s.context_len for s in decoding])
    padding = np.arange(width * block_size)[None, :] >= context[:, None]
    return _Decodes(
        rows=np.array([s.start for s in decoding], dtype=np.int64),
        tables=tables,
        bias=np.where(padding, -np.inf, 0.0).astype(np.float32),
    )


def paged_attention(q: Floats, keys: Floats, values: Floats, plan: AttentionPlan, scale: float) -> Floats:
    """q: [N, heads, head_dim] for the flat batch; keys/values: one layer's [blocks, block_size,
    kv_heads, head_dim] pool, already holding this step's K/V. Returns [N, heads, head_dim]."""
    out = np.empty_like(q)
    for d in plan.decodes:
        out[d.rows] = _decode(q[d.rows], keys, values, d, scale)
    for p in plan.prefills:
        rows = slice(p.slice.start, p.slice.start + p.slice.length)
        out[rows] = _prefill(q[rows], keys, values, p, scale)
    for w in plan.viewed:
        rows = slice(w.slice.start, w.slice.start + w.slice.length)
        out[rows] = _viewed(q[rows], keys, values, w, scale)
    return out


def _decode(q: Floats, keys: Floats, values: Floats, d: _Decodes, scale: float) -> Floats:
    batch, heads, hd = q.shape
    kv_heads = keys.shape[2]
    length = d.bias.shape[1]
    k = keys[d.tables].reshape(batch, length, kv_heads, hd).transpose(0, 2, 3, 1)  # [B, kvh, hd, L]
    v = values[d.tables].reshape(batch, length, kv_heads, hd).transpose(0, 2, 1, 3)  # [B, kvh, L, hd]
    scores = (q * scale).reshape(batch, kv_heads, heads // kv_heads, hd) @ k  # [B, kvh, group, L]
    scores += d.bias[:, None, None, :]
    result: Floats = _softmax_product(scores, v).reshape(batch, heads, hd)
    return result


def _prefill(q: Floats, keys: Floats, values: Floats, p: _Prefill, scale: float) -> Floats:
    """A chunk whose table is fragmented: its context gathered into one run, then as _viewed."""
    kv_heads, hd = keys.shape[2], keys.shape[3]
    k = keys[p.slice.block_table].reshape(-1, kv_heads, hd)
    v = values[p.slice.block_table].reshape(-1, kv_heads, hd)
    context = p.slice.context_len
    return _attend_runs(q, k, v, ((0, context),), context, p.bias, scale)


def _viewed(q: Floats, keys: Floats, values: Floats, w: _Viewed, scale: float) -> Floats:
    """A decode (a chunk of one) or a chunk read run by run through views of the pool."""
    kv_heads, hd = keys.shape[2], keys.shape[3]
    flat_keys, flat_values = keys.reshape(-1, kv_heads, hd), values.reshape(-1, kv_heads, hd)
    return _attend_runs(q, flat_keys, flat_values, w.runs, w.slice.context_len, w.bias, scale)


def _attend_runs(
    q: Floats,
    flat_keys: Floats,
    flat_values: Floats,
    runs: tuple[tuple[int, int], ...],
    context: int,
    bias: Floats | None,
    scale: float,
) -> Floats:
    """q [C, heads, hd] attending to the context held in `runs` (first slot, keys) of the flat
    [slots, kv_heads, hd] K/V, with `bias` the chunk's causal mask over its own keys (None: a
    decode). One product per KV head, its group's queries stacked: [kvh, group * C, hd]."""
    if bias is None and context >= GEMV_MIN_KEYS:
        return _attend_one(q, flat_keys, flat_values, runs, context, scale)
    chunk, heads, hd = q.shape
    kv_heads = flat_keys.shape[1]
    group = heads // kv_heads
    qg = (q * scale).reshape(chunk, kv_heads, group, hd).transpose(1, 2, 0, 3).reshape(kv_heads, -1, hd)
    if len(runs) == 1:
        slot, n = runs[0]
        scores = qg @ flat_keys[slot : slot + n].transpose(1, 2, 0)  # [kvh, group * C, ctx]
    else:
        scores = np.empty((kv_heads, group * chunk, context), dtype=np.float32)
        at = 0
        for slot, n in runs:
            scores[..., at : at + n] = qg @ flat_keys[slot : slot + n].transpose(1, 2, 0)
            at += n
    if bias is not None:
        scores.reshape(kv_heads, group, chunk, context)[..., context - chunk :] += bias
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    (slot, n), *rest = runs
    out: Floats = scores[..., :n] @ flat_values[slot : slot + n].transpose(1, 0, 2)  # [kvh, group * C, hd]
    at = n
    for slot, n in rest:
        out += scores[..., at : at + n] @ flat_values[slot : slot + n].transpose(1, 0, 2)
        at += n
    out /= total
    result: Floats = out.reshape(kv_heads, group, chunk, hd).transpose(2, 0, 1, 3).reshape(chunk, heads, hd)
    return result


def _attend_one(
    q: Floats,
    flat_keys: Floats,
    flat_values: Floats,
    runs: tuple[tuple[int, int], ...],
    context: int,
    scale: float,
) -> Floats:
    """A decode's one query per head against a long context, as matrix-vector products.

    With one query token a head group is 3 rows against thousands of keys, and OpenBLAS's GEMM for
    so few rows copies (packs) the keys before it multiplies: at 2,000 keys the product read K at
    2.5 GB/s where a sum over it reads at 8. A GEMV reads a head's keys in place, strided
    ([keys, head_dim] rows kv_heads * head_dim apart), and the group's other queries find them in
    the cache."""
    heads, hd = q.shape[1], q.shape[2]
    group = heads // flat_keys.shape[1]
    queries = q[0] * scale
    scores = np.empty((heads, context), dtype=np.float32)
    for h in range(heads):
        at = 0
        for slot, n in runs:
            np.matmul(flat_keys[slot : slot + n, h // group], queries[h], out=scores[h, at : at + n])
            at += n
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1)
    out = np.zeros((heads, hd), dtype=np.float32)
    for h in range(heads):
        at = 0
        for slot, n in runs:
            out[h] += scores[h, at : at + n] @ flat_values[slot : slot + n, h // group]
            at += n
    out /= total[:, None]
    return out[None]


def _softmax_product(scores: Floats, v: Floats) -> Floats:
    """softmax(scores) @ v, the softmax in place in `scores` and normalised after the product."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    out: Floats = scores @ v
    out /= total
    return out
