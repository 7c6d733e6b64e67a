"""The tiny demo Llama: seeded random weights and a byte-level BPE tokenizer trained on a built-in
corpus, written as a Hugging Face-style checkpoint so `make serve` needs no download.

Random weights babble; the point is a real tokenizer, a real chat template and a real architecture
end to end. Building is deterministic (same bytes every time) and safe when processes race.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gpu_container.engine.demo_corpus import DEMO_CORPUS
from gpu_container.engine.llama_config import LlamaConfig

if TYPE_CHECKING:
    from gpu_container.engine.arrays import Floats

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_VOCAB_TARGET = 1024
_SEED = 20240601


def build_demo_model(directory: Path) -> Path:
    """Write the demo checkpoint into `directory` unless it is already complete; return it."""
    directory = Path(directory)
    if is_complete(directory):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        _write(staging)
        if directory.exists() and not is_complete(directory):
            _discard(directory)
        try:
            os.rename(staging, directory)
        except OSError:
            # Another process renamed its own complete copy into place first.
            if not is_complete(directory):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in FILES)


def _discard(directory: Path) -> None:
    """Move a partial directory out of the way (atomically, so a racing reader never sees it half gone)."""
    trash = Path(tempfile.mkdtemp(prefix=f".{directory.name}.trash.", dir=directory.parent))
    try:
        os.rename(directory, trash / directory.name)
    except FileNotFoundError:
        pass
    shutil.rmtree(trash, ignore_errors=True)


def _write(directory: Path) -> None:
    # Imported only to write: an edge finding the model already built (every start but the first)
    # never loads numpy, nor OpenBLAS's threads.
    from safetensors.numpy import save_file

    tokenizer = _train_tokenizer()
    ids = {token: _special_id(tokenizer, token) for token in SPECIAL_TOKENS}
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        # The chat turn end first: it is what ends an assistant reply; plain end-of-text as well.
        eos_token_ids=(ids[IM_END], ids[END_OF_TEXT]),
    )
    _write_json(directory / "config.json", config.to_hf())
    save_file(_weights(config), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": END_OF_TEXT,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": config.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _special_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise RuntimeError(f"demo tokenizer lacks {token!r}")
    return int(token_id)


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_TARGET,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(DEMO_CORPUS.splitlines(), trainer)
    return tokenizer


def _weights(config: LlamaConfig) -> dict[str, Floats]:
    import numpy as np

    rng = np.random.default_rng(_SEED)
    hidden, inter, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q_out, kv_out = config.num_attention_heads * hd, config.num_key_value_heads * hd

    def normal(rows: int, cols: int, std: float) -> Floats:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(config.vocab_size, hidden, 1.0)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors |= {
            f"{p}self_attn.q_proj.weight": normal(q_out, hidden, hidden**-0.5),
            f"{p}self_attn.k_proj.weight": normal(kv_out, hidden, hidden**-0.5),
            f"{p}self_attn.v_proj.weight": normal(kv_out, hidden, hidden**-0.5),
            f"{p}self_attn.o_proj.weight": normal(hidden, q_out, q_out**-0.5),
            f"{p}mlp.gate_proj.weight": normal(inter, hidden, hidden**-0.5),
            f"{p}mlp.up_proj.weight": normal(inter, hidden, hidden**-0.5),
            f"{p}mlp.down_proj.weight": normal(hidden, inter, inter**-0.5),
            f"{p}input_layernorm.weight": np.ones(hidden, dtype=np.float32),
            f"{p}post_attention_layernorm.weight": np.ones(hidden, dtype=np.float32),
        }
    tensors["model.norm.weight"] = np.ones(hidden, dtype=np.float32)
    # Scaled so next-token distributions are peaked enough for greedy output to vary with context.
    tensors["lm_head.weight"] = normal(config.vocab_size, hidden, 2.0 * hidden**-0.5)
    return tensors
