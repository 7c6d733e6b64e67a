"""Grouped-query attention reading K/V through block tables of the paged cache.

A plan is built once per step (the block tables and masks are the same in every layer): decodes,
one query each, are batched over tables padded to the longest; prefill chunks run one by one, each
query attending causally to its sequence's cached prefix and to the chunk itself.
"""

from __future__ import annotations

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
    bias: Floats  # [chunk, context_len]: 0 where a query may look, -inf in its future


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    decodes: _Decodes | None
    prefills: tuple[_Prefill, ...]

    @classmethod
    def build(cls, slices: tuple[SequenceSlice, ...], block_size: int) -> AttentionPlan:
        decoding = [s for s in slices if s.length == 1]
        decodes = None
        if decoding:
            width = max(len(s.block_table) for s in decoding)
            tables = np.zeros((len(decoding), width), dtype=np.int64)
            for i, s in enumerate(decoding):
                tables[i, : len(s.block_table)] = s.block_table
            context = np.array([s.context_len for s in decoding])
            padding = np.arange(width * block_size)[None, :] >= context[:, None]
            decodes = _Decodes(
                rows=np.array([s.start for s in decoding], dtype=np.int64),
                tables=tables,
                bias=np.where(padding, -np.inf, 0.0).astype(np.float32),
            )
        prefills = []
        for s in slices:
            if s.length > 1:
                query_pos = s.context_len - s.length + np.arange(s.length)
                future = np.arange(s.context_len)[None, :] > query_pos[:, None]
                prefills.append(_Prefill(s, np.where(future, -np.inf, 0.0).astype(np.float32)))
        return cls(decodes, tuple(prefills))


def paged_attention(q: Floats, keys: Floats, values: Floats, plan: AttentionPlan, scale: float) -> Floats:
    """q: [N, heads, head_dim] for the flat batch; keys/values: one layer's [blocks, block_size,
    kv_heads, head_dim] pool, already holding this step's K/V. Returns [N, heads, head_dim]."""
    out = np.empty_like(q)
    if plan.decodes is not None:
        d = plan.decodes
        out[d.rows] = _decode(q[d.rows], keys, values, d, scale)
    for p in plan.prefills:
        rows = slice(p.slice.start, p.slice.start + p.slice.length)
        out[rows] = _prefill(q[rows], keys, values, p, scale)
    return out


def _decode(q: Floats, keys: Floats, values: Floats, d: _Decodes, scale: float) -> Floats:
    batch, heads, hd = q.shape
    kv_heads = keys.shape[2]
    length = d.bias.shape[1]
    k = keys[d.tables].reshape(batch, length, kv_heads, hd).transpose(0, 2, 3, 1)  # [B, kvh, hd, L]
    v = values[d.tables].reshape(batch, length, kv_heads, hd).transpose(0, 2, 1, 3)  # [B, kvh, L, hd]
    scores = (q.reshape(batch, kv_heads, heads // kv_heads, hd) @ k) * scale  # [B, kvh, group, L]
    scores += d.bias[:, None, None, :]
    result: Floats = (_softmax(scores) @ v).reshape(batch, heads, hd)
    return result


def _prefill(q: Floats, keys: Floats, values: Floats, p: _Prefill, scale: float) -> Floats:
    chunk, heads, hd = q.shape
    kv_heads = keys.shape[2]
    context = p.slice.context_len
    k = keys[p.slice.block_table].reshape(-1, kv_heads, hd)[:context].transpose(1, 2, 0)  # [kvh, hd, ctx]
    v = values[p.slice.block_table].reshape(-1, kv_heads, hd)[:context].transpose(1, 0, 2)  # [kvh, ctx, hd]
    qg = q.reshape(chunk, kv_heads, heads // kv_heads, hd).transpose(1, 2, 0, 3)  # [kvh, group, C, hd]
    scores = (qg @ k[:, None]) * scale + p.bias  # [kvh, group, C, ctx]
    result: Floats = (_softmax(scores) @ v[:, None]).transpose(2, 0, 1, 3).reshape(chunk, heads, hd)
    return result


def _softmax(x: Floats) -> Floats:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: Floats = e / e.sum(axis=-1, keepdims=True)
    return out
