"""A small random Llama checkpoint (HF tensor names) for tests that need a model but not the demo's."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpu_container.engine.llama_config import LlamaConfig
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.weights import LlamaWeights

Tensors = dict[str, npt.NDArray[np.float32]]


def tiny_config(tie_word_embeddings: bool = False, vocab_size: int = 97) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_ids=(1,),
    )


def tiny_tensors(config: LlamaConfig, seed: int = 0) -> Tensors:
    rng = np.random.default_rng(seed)
    h, hd = config.hidden_size, config.head_dim
    q, kv, inter = config.num_attention_heads * hd, config.num_key_value_heads * hd, config.intermediate_size

    def w(*shape: int) -> npt.NDArray[np.float32]:
        values: npt.NDArray[np.float32] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        return values

    tensors: Tensors = {"model.embed_tokens.weight": w(config.vocab_size, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors |= {
            f"{p}self_attn.q_proj.weight": w(q, h),
            f"{p}self_attn.k_proj.weight": w(kv, h),
            f"{p}self_attn.v_proj.weight": w(kv, h),
            f"{p}self_attn.o_proj.weight": w(h, q),
            f"{p}mlp.gate_proj.weight": w(inter, h),
            f"{p}mlp.up_proj.weight": w(inter, h),
            f"{p}mlp.down_proj.weight": w(h, inter),
            f"{p}input_layernorm.weight": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
            f"{p}post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
        }
    tensors["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = w(config.vocab_size, h)
    return tensors


def tiny_model(tie_word_embeddings: bool = False, seed: int = 0) -> tuple[LlamaModel, Tensors]:
    config = tiny_config(tie_word_embeddings)
    tensors = tiny_tensors(config, seed)
    return LlamaModel(config, LlamaWeights.from_hf(config, tensors)), tensors
