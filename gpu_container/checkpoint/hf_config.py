"""config.json (Hugging Face Llama) from a GGUF's `llama.*` metadata, refusing what we don't implement."""

from __future__ import annotations

from typing import Any

from gpu_container.checkpoint.errors import UnsupportedModel
from gpu_container.checkpoint.gguf_file import GgufFile
from gpu_container.engine.llama_config import LlamaConfig

ARCHITECTURE = "llama"
# RoPE variants and extras whose presence changes the math; plain Llama has none of them.
_UNIMPLEMENTED_KEYS = ("rope.scaling.type", "rope.scaling.factor", "expert_count", "attention.sliding_window")


def hf_config(gguf: GgufFile, *, tied: bool) -> dict[str, Any]:
    """`tied`: the file has no `output.weight`, so the head is the embedding (no second copy)."""
    arch = gguf.require("general.architecture")
    if arch != ARCHITECTURE:
        raise UnsupportedModel(f"{gguf.path}: architecture {arch!r} is not supported (only {ARCHITECTURE!r})")
    for key in _UNIMPLEMENTED_KEYS:
        value = gguf.value(f"{ARCHITECTURE}.{key}")
        if value not in (None, "none", 0, 1.0):
            raise UnsupportedModel(f"{gguf.path}: {ARCHITECTURE}.{key} = {value!r} is not supported")

    def get(key: str) -> Any:
        return gguf.require(f"{ARCHITECTURE}.{key}")

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(gguf.value(f"{ARCHITECTURE}.attention.key_length", hidden // heads))
    rotary = int(gguf.value(f"{ARCHITECTURE}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise UnsupportedModel(f"{gguf.path}: partial rotary ({rotary} of {head_dim} dims) is not supported")
    tokens = gguf.require("tokenizer.ggml.tokens")
    eos = [int(gguf.require("tokenizer.ggml.eos_token_id"))]
    # A separate end-of-turn token (Llama 3's <|eot_id|>) also ends a reply.
    eot = gguf.value("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos:
        eos.append(int(eot))
    config = LlamaConfig(
        vocab_size=int(gguf.value(f"{ARCHITECTURE}.vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf.value(f"{ARCHITECTURE}.attention.head_count_kv", heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(gguf.value(f"{ARCHITECTURE}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length")),
        tie_word_embeddings=tied,
        eos_token_ids=tuple(eos),
        head_dim=head_dim,
    )
    raw = config.to_hf()
    bos = gguf.value("tokenizer.ggml.bos_token_id")
    if bos is not None:
        raw["bos_token_id"] = int(bos)
    return raw
