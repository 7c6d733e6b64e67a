"""Llama weights laid out for the numpy forward: projections transposed to [in, out] and fused
(q|k|v, gate|up) so each layer does four matrix products.

Layouts chosen by measurement (bench/engine.py, docs/bench-engine.md): a one-row product against an
[in, out] matrix runs OpenBLAS's fastest GEMV, about twice the speed of the [out, in] one, and
batch-1 decode is the memory-bound case the layout is for. The head stays in the checkpoint's
[vocab, hidden] layout, and a tied head IS the embedding array: no second copy of the largest
matrix (113 MB for SmolLM2-135M), and x @ head.T beats x @ [hidden, vocab] from two rows up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_container.engine.arrays import Floats
from gpu_container.engine.llama_config import LlamaConfig


@dataclass(frozen=True, slots=True)
class LayerWeights:
    input_norm: Floats  # [hidden]
    qkv_proj: Floats  # [hidden, (heads + 2 * kv_heads) * head_dim]
    o_proj: Floats  # [heads * head_dim, hidden]
    post_attention_norm: Floats  # [hidden]
    gate_up_proj: Floats  # [hidden, 2 * intermediate]
    down_proj: Floats  # [intermediate, hidden]


@dataclass(frozen=True, slots=True)
class LlamaWeights:
    embed_tokens: Floats  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    norm: Floats  # [hidden]
    # [hidden, vocab], contiguous (x @ lm_head): SmolLM2's head, thread CPU time, one run on the AMD
    # EPYC (2026-12-01): 1 row 5.5-6.4 ms against 8.2-8.8 as x @ embed.T, 2-16 rows 0.80-0.84x
    # (bench.engine_measures.head_table). A tied head is stored once, this way round, and
    # embed_tokens is its transpose (a view: a prompt's 512 rows gather in 4 ms, not 0.1).
    lm_head: Floats

    @classmethod
    def from_hf(cls, config: LlamaConfig, tensors: Mapping[str, npt.NDArray[Any]]) -> LlamaWeights:
        """Build from Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight, ...)."""

        check_layout(config, {name: tuple(tensor.shape) for name, tensor in tensors.items()})
        read: set[str] = set()

        def get(name: str) -> Floats:
            if name not in tensors:
                raise KeyError(f"checkpoint has no tensor {name!r}")
            read.add(name)
            return np.asarray(tensors[name], dtype=np.float32)

        def fused(*names: str) -> Floats:
            return np.ascontiguousarray(np.concatenate([get(n) for n in names], axis=0).T)

        layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = [f"{p}self_attn.{x}_proj.weight" for x in ("q", "k", "v")]
            layers.append(
                LayerWeights(
                    input_norm=get(f"{p}input_layernorm.weight"),
                    qkv_proj=fused(*attn),
                    o_proj=fused(f"{p}self_attn.o_proj.weight"),
                    post_attention_norm=get(f"{p}post_attention_layernorm.weight"),
                    gate_up_proj=fused(f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"),
                    down_proj=fused(f"{p}mlp.down_proj.weight"),
                )
            )
        embed = get("model.embed_tokens.weight")
        head_name = "lm_head.weight"
        tied = config.tie_word_embeddings or head_name not in tensors
        head = np.ascontiguousarray((embed if tied else get(head_name)).T)
        norm = get("model.norm.weight")
        _refuse_unread(tensors.keys() - read - {head_name})
        return cls(
            embed_tokens=head.T if tied else embed,
            layers=tuple(layers),
            norm=norm,
            lm_head=head,
        )

    @property
    def tied(self) -> bool:
        """The head and the embedding are one array."""
        return self.embed_tokens.base is self.lm_head

    @property
    def nbytes(self) -> int:
        """Bytes one decode step reads: every projection and the head (the embedding row is noise)."""
        projections = sum(
            w.nbytes
            for layer in self.layers
            for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
        )
        return projections + self.lm_head.nbytes

    @property
    def resident_bytes(self) -> int:
        """Bytes the weights hold in memory (a tied head counted once)."""
        norms = sum(layer.input_norm.nbytes + layer.post_attention_norm.nbytes for layer in self.layers)
        head = 0 if self.tied else self.lm_head.nbytes
        return self.nbytes - self.lm_head.nbytes + head + self.embed_tokens.nbytes + norms + self.norm.nbytes


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama checkpoint of `config` holds, by its Hugging Face name, in Hugging Face's
    [out, in] layout; a head of its own ("lm_head.weight") is optional."""
    hidden, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            f"{p}input_layernorm.weight": (hidden,),
            f"{p}post_attention_layernorm.weight": (hidden,),
            f"{p}self_attn.q_proj.weight": (q_rows, hidden),
            f"{p}self_attn.k_proj.weight": (kv_rows, hidden),
            f"{p}self_attn.v_proj.weight": (kv_rows, hidden),
            f"{p}self_attn.o_proj.weight": (hidden, q_rows),
            f"{p}mlp.gate_proj.weight": (inter, hidden),
            f"{p}mlp.up_proj.weight": (inter, hidden),
            f"{p}mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def check_layout(config: LlamaConfig, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """A ValueError naming what does not fit `config`: a missing tensor (it was a bare KeyError out of
    the engine's start), one of another shape (it loaded, fused with its neighbours, and failed or
    answered noise at the first request), one the forward has no place for. The GGUF import checks
    the same before it writes, so no import a start then refuses is ever cached."""
    expected = expected_shapes(config)
    missing = [name for name in expected if name not in shapes]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ValueError(f"checkpoint has no tensor {', '.join(repr(n) for n in missing[:3])}{more}")
    head = "lm_head.weight"
    if head in shapes:
        expected[head] = (config.vocab_size, config.hidden_size)
    for name, want in expected.items():
        if tuple(shapes[name]) != want:
            raise ValueError(
                f"tensor {name!r} has shape {tuple(shapes[name])}, where the config gives {want}"
            )
    _refuse_unread(shapes.keys() - expected.keys())


# RoPE's frequencies, saved as a buffer by older Hugging Face conversions: the model recomputes them.
_ROPE_BUFFER = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def _refuse_unread(names: Iterable[str]) -> None:
    """A tensor the forward has no place for (Qwen2's q/k/v biases, Qwen3's q/k norms, Gemma 2's
    extra norms) means another architecture under Llama's tensor names: dropped, it loaded into
    wrong answers with no error, where the GGUF import refuses it (checkpoint/tensor_names.py).
    A tied checkpoint's lm_head copy is not such a tensor (the caller leaves it out)."""
    extra = sorted(n for n in names if not _ROPE_BUFFER.fullmatch(n))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        shown = ", ".join(repr(n) for n in extra[:3]) + more
        raise ValueError(f"checkpoint has tensors a plain Llama model has no place for: {shown}")
