"""The Llama architecture in numpy, float32: RMSNorm, RoPE, grouped-query attention over the paged
KV cache, SwiGLU MLP. One call runs one engine step: a flat batch mixing decodes and prefill chunks.

Small batches may multiply row by row: on some machines OpenBLAS's GEMM for a few rows against a
wide [in, out] matrix costs several GEMV passes whatever the row count (its packing), while each
GEMV re-reads the matrix from the last-level cache (an AMD EPYC: the two met at about 16 rows); on
others the GEMM wins from 3 rows on (an Intel Xeon). The model's `knee_rows` says up to how many
rows it takes the GEMVs: measured when the engine starts (gemv_knee.py), or set (`[engine]`
gemv_knee_rows); the knee never changes the result beyond float rounding."""

from __future__ import annotations

import numpy as np

from gpu_container.engine.arrays import Floats, Ints
from gpu_container.engine.attention import AttentionPlan, paged_attention
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.llama_config import LlamaConfig
from gpu_container.engine.weights import LlamaWeights


def rms_norm(x: Floats, weight: Floats, eps: float) -> Floats:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    out: Floats = x / np.sqrt(variance + eps) * weight
    return out


# The most rows the knee is measured for, and the knee a model has until the engine measures or
# sets it (the EPYC's, where this engine was first measured).
MAX_KNEE_ROWS = 16


def linear(x: Floats, weight: Floats, knee_rows: int) -> Floats:
    """x [rows, in] @ weight [in, out]: one GEMV per row up to knee_rows rows, else one GEMM."""
    rows = x.shape[0]
    if 1 < rows <= knee_rows:
        out = np.empty((rows, weight.shape[1]), dtype=np.float32)
        for i in range(rows):
            np.matmul(x[i], weight, out=out[i])
        return out
    result: Floats = x @ weight
    return result


def silu(x: Floats) -> Floats:
    out: Floats = x / (1.0 + np.exp(-x))
    return out


class LlamaModel:
    def __init__(self, config: LlamaConfig, weights: LlamaWeights) -> None:
        self.config = config
        self.weights = weights
        # Up to this many rows a projection is one GEMV per row (the module docstring); the step
        # cost model (step_budget.py) bends here too.
        self.knee_rows = MAX_KNEE_ROWS
        half = config.head_dim // 2
        self._inv_freq = 1.0 / (
            config.rope_theta ** (np.arange(half, dtype=np.float64) * 2 / config.head_dim)
        )
        self._scale = float(1.0 / np.sqrt(config.head_dim))

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        """Write the batch's K/V into the cache and return logits [len(logits_rows), vocab]."""
        cfg = self.config
        n, heads, kv_heads, hd = (
            len(batch.token_ids),
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        cos, sin = self._rope_tables(batch.positions)
        plan = AttentionPlan.build(batch.slices, cache.block_size)
        x = self.weights.embed_tokens[batch.token_ids]
        knee = self.knee_rows
        for index, layer in enumerate(self.weights.layers):
            h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            qkv = linear(h, layer.qkv_proj, knee)
            q = qkv[:, : heads * hd].reshape(n, heads, hd)
            k = qkv[:, heads * hd : (heads + kv_heads) * hd].reshape(n, kv_heads, hd)
            v = qkv[:, (heads + kv_heads) * hd :].reshape(n, kv_heads, hd)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            layer_keys, layer_values = cache.keys[index], cache.values[index]
            layer_keys.reshape(-1, kv_heads, hd)[batch.slot_mapping] = k
            layer_values.reshape(-1, kv_heads, hd)[batch.slot_mapping] = v
            attn = paged_attention(q, layer_keys, layer_values, plan, self._scale)
            x = x + linear(attn.reshape(n, heads * hd), layer.o_proj, knee)
            h = rms_norm(x, layer.post_attention_norm, cfg.rms_norm_eps)
            gate, up = np.split(linear(h, layer.gate_up_proj, knee), 2, axis=-1)
            x = x + linear(silu(gate) * up, layer.down_proj, knee)
        last = rms_norm(x[batch.logits_rows], self.weights.norm, cfg.rms_norm_eps)
        logits: Floats = last @ self.weights.lm_head
        return logits

    def _rope_tables(self, positions: Ints) -> tuple[Floats, Floats]:
        angles = positions[:, None].astype(np.float64) * self._inv_freq[None, :]
        angles = np.concatenate([angles, angles], axis=-1)
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rotate(x: Floats, cos: Floats, sin: Floats) -> Floats:
    """RoPE in the Hugging Face (rotate-half) layout: pairs are (i, i + head_dim / 2)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out: Floats = x * cos[:, None, :] + rotated * sin[:, None, :]
    return out
