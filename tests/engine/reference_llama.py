"""A deliberately plain Llama forward for one sequence: full recompute, no cache, no batching, HF
weight layout, float64. The engine's paged, batched forward is checked against it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpu_container.engine.llama_config import LlamaConfig

Array = npt.NDArray[np.float64]


def reference_logits(
    config: LlamaConfig, tensors: dict[str, npt.NDArray[np.float32]], token_ids: list[int]
) -> Array:
    """Next-token logits after the last of token_ids."""
    t = {name: value.astype(np.float64) for name, value in tensors.items()}
    n, hd = len(token_ids), config.head_dim
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads

    def norm(x: Array, weight: Array) -> Array:
        result: Array = weight * x / np.sqrt((x**2).mean(-1, keepdims=True) + config.rms_norm_eps)
        return result

    def rope(x: Array) -> Array:  # x: [n, heads, hd]
        result = np.empty_like(x)
        for pos in range(n):
            for i in range(hd // 2):
                theta = pos / config.rope_theta ** (2 * i / hd)
                a, b = x[pos, :, i], x[pos, :, i + hd // 2]
                result[pos, :, i] = a * np.cos(theta) - b * np.sin(theta)
                result[pos, :, i + hd // 2] = b * np.cos(theta) + a * np.sin(theta)
        return result

    x = t["model.embed_tokens.weight"][token_ids]
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = norm(x, t[p + "input_layernorm.weight"])
        q = rope((h @ t[p + "self_attn.q_proj.weight"].T).reshape(n, heads, hd))
        k = rope((h @ t[p + "self_attn.k_proj.weight"].T).reshape(n, kv_heads, hd))
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(n, kv_heads, hd)
        attn = np.zeros((n, heads, hd))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            for i in range(n):
                scores = k[: i + 1, kv] @ q[i, head] / np.sqrt(hd)
                weights = np.exp(scores - scores.max())
                attn[i, head] = (weights / weights.sum()) @ v[: i + 1, kv]
        x = x + attn.reshape(n, heads * hd) @ t[p + "self_attn.o_proj.weight"].T
        h = norm(x, t[p + "post_attention_layernorm.weight"])
        gate = h @ t[p + "mlp.gate_proj.weight"].T
        up = h @ t[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "mlp.down_proj.weight"].T
    head_weight = t["model.embed_tokens.weight"] if config.tie_word_embeddings else t["lm_head.weight"]
    logits: Array = norm(x[-1], t["model.norm.weight"]) @ head_weight.T
    return logits
