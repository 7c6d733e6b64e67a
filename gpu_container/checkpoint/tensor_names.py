"""llama.cpp's tensor names to Hugging Face Llama names (the ones LlamaWeights.from_hf reads)."""

from __future__ import annotations

import re

from gpu_container.checkpoint.errors import UnsupportedModel

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(path: object, gguf_name: str) -> str:
    """The HF name; a tensor we do not know (rope_freqs for Llama 3.1 scaling, biases, experts) is
    refused: dropping it silently would load a different model."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    match = _BLOCK.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER:
        return f"model.layers.{match.group(1)}.{_LAYER[match.group(2)]}.weight"
    raise UnsupportedModel(f"{path}: tensor {gguf_name!r} has no place in a plain Llama model")
