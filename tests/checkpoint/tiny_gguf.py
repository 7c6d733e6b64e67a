"""A tiny llama GGUF written with the `gguf` library's own writer, laid out as llama.cpp's
convert_hf_to_gguf.py lays out a real one (Q/K rows permuted, no output.weight when tied), plus
the HF tensors it came from, so an import can be compared with its source exactly.

Vocabulary: three ChatML control tokens, the 256 byte-level symbols, and a few merges, among them
"1 2" (which the `smollm` pre-tokenizer must never apply: it splits digits first).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, quants
from tokenizers import pre_tokenizers

Q = GGMLQuantizationType
Tensors = dict[str, npt.NDArray[np.float32]]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]
HIDDEN, HEADS, KV_HEADS, INTER, LAYERS = 64, 4, 2, 256, 1
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def vocabulary() -> list[str]:
    merged = ["".join(m.split(" ")) for m in MERGES]
    return SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + merged


def llama_cpp_permute(weight: npt.NDArray[np.float32], heads: int) -> npt.NDArray[np.float32]:
    """convert_hf_to_gguf.py's LlamaModel.permute, as it is applied to q_proj (and k_proj with KV heads)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def hf_tensors(vocab: int, *, tied: bool, seed: int = 0) -> Tensors:
    rng = np.random.default_rng(seed)
    hd = HIDDEN // HEADS

    def w(*shape: int) -> npt.NDArray[np.float32]:
        return rng.standard_normal(shape).astype(np.float32) / np.float32(np.sqrt(shape[-1]))

    tensors: Tensors = {"model.embed_tokens.weight": w(vocab, HIDDEN), "model.norm.weight": w(HIDDEN) + 1}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            f"{p}input_layernorm.weight": w(HIDDEN) + 1,
            f"{p}post_attention_layernorm.weight": w(HIDDEN) + 1,
            f"{p}self_attn.q_proj.weight": w(HEADS * hd, HIDDEN),
            f"{p}self_attn.k_proj.weight": w(KV_HEADS * hd, HIDDEN),
            f"{p}self_attn.v_proj.weight": w(KV_HEADS * hd, HIDDEN),
            f"{p}self_attn.o_proj.weight": w(HIDDEN, HEADS * hd),
            f"{p}mlp.gate_proj.weight": w(INTER, HIDDEN),
            f"{p}mlp.up_proj.weight": w(INTER, HIDDEN),
            f"{p}mlp.down_proj.weight": w(HIDDEN, INTER),
        }
    if not tied:
        tensors["lm_head.weight"] = w(vocab, HIDDEN)
    return tensors


_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    if hf in _TO_GGUF:
        return _TO_GGUF[hf]
    layer, rest = hf.removeprefix("model.layers.").split(".", 1)
    return f"blk.{layer}.{_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    pre: str = "smollm",
    tied: bool = True,
    down_type: GGMLQuantizationType = Q.F32,
    extra: Callable[[GGUFWriter], None] | None = None,
    seed: int = 0,
) -> Tensors:
    """Write the GGUF; return the HF tensors it holds (ffn_down as the file's type dequantizes it)."""
    tokens = vocabulary()
    tensors = hf_tensors(len(tokens), tied=tied, seed=seed)
    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    if extra is not None:
        extra(writer)
    for hf, value in tensors.items():
        name = gguf_name(hf)
        if name.endswith("attn_q.weight"):
            value = llama_cpp_permute(value, HEADS)
        elif name.endswith("attn_k.weight"):
            value = llama_cpp_permute(value, KV_HEADS)
        if name.endswith("ffn_down.weight") and down_type != Q.F32:
            raw = _encoded(value, down_type, seed)
            writer.add_tensor(name, raw, raw_dtype=down_type)
            tensors[hf] = quants.dequantize(raw, down_type).reshape(value.shape).astype(np.float32)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def _encoded(value: npt.NDArray[np.float32], kind: GGMLQuantizationType, seed: int) -> npt.NDArray[np.uint8]:
    if kind == Q.F16:
        return value.astype(np.float16).view(np.uint8).reshape(value.shape[0], -1)
    try:
        return quants.quantize(value, kind)
    except NotImplementedError:
        # gguf-py dequantizes the K-quants but cannot quantize them: random blocks, with every
        # byte pattern valid, still check that the import reads them as the library decodes them.
        block, size = GGML_QUANT_SIZES[kind]
        rng = np.random.default_rng(seed)
        raw = rng.integers(0, 256, (value.shape[0], value.shape[1] // block * size), dtype=np.uint8)
        # Bit 6 clear in every byte keeps each float16 scale's exponent below 31 (no inf or NaN).
        return raw & np.uint8(0xBF)
