"""The Llama architecture's hyperparameters, read from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    head_dim: int = 0

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def from_hf(cls, raw: dict[str, Any], *, eos_token_ids: tuple[int, ...] = ()) -> LlamaConfig:
        """The architecture from config.json; the end tokens come from gpu_container.checkpoint.facts,
        which reads them from every file that names them."""
        scaling = raw.get("rope_scaling")
        if scaling:
            # Llama 3.1-style frequency scaling changes RoPE; silently ignoring it would give wrong logits.
            raise ValueError(f"rope_scaling is not supported: {scaling!r}")
        _refuse_what_llama_lacks(raw)
        num_heads = int(raw["num_attention_heads"])
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            max_position_embeddings=_positions(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=eos_token_ids,
            head_dim=int(raw.get("head_dim") or 0),
        )

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "eos_token_id": list(self.eos_token_ids),
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }


# The activation keys of config.json: Llama's `hidden_act`, and Gemma's `hidden_activation`.
_ACTIVATION_KEYS = ("hidden_act", "hidden_activation")
# SwiGLU's activation under the names transformers gives it (its ACT2FN: "swish" is SiLU too).
_SILU = ("silu", "swish")


def _refuse_what_llama_lacks(raw: dict[str, Any]) -> None:
    """Refuse a config.json whose model computes otherwise than the forward here (SwiGLU, no bias),
    as the GGUF import refuses such a file (checkpoint/hf_config.py). Gemma names its tensors as
    Llama does, and Llama's own attention_bias / mlp_bias add tensors the forward would drop:
    loaded as a plain Llama, they served fluent-looking nonsense with no error anywhere."""
    for key in _ACTIVATION_KEYS:
        act = raw.get(key)
        if act is not None and act not in _SILU:
            raise ValueError(f"{key} {act!r} is not supported (only 'silu')")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            raise ValueError(f"{key} is not supported")


def _positions(raw: dict[str, Any]) -> int:
    """The positions the forward here computes as the checkpoint's model does: its
    max_position_embeddings, but no more than a sliding window it uses (Mistral 7B v0.1's 4,096 of
    32,768). Within the window every earlier token is attended to, as here; past it the model sees
    only the window, which this forward does not do, so a longer context would be wrong answers.
    Qwen2 states a window it does not use (use_sliding_window false)."""
    positions = int(raw.get("max_position_embeddings", 2048))
    window = raw.get("sliding_window")
    if window is not None and raw.get("use_sliding_window", True) is not False:
        return min(positions, int(window))
    return positions
