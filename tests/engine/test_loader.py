"""Loading a Hugging Face-style directory gives the same model as building it from the tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from gpu_container.engine.arrays import Floats
from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.loader import load_model
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.safetensors_io import load_safetensors
from gpu_container.engine.scheduler import ScheduledChunk
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import SamplingParams
from tests.engine.tiny_llama import tiny_config, tiny_model


def _logits(model: LlamaModel, prompt: list[int]) -> Floats:
    cfg = model.config
    blocks = BlockManager(8, 4)
    seq = Sequence("x", prompt, SamplingParams(temperature=0), lambda _: None)
    blocks.reserve(seq, len(prompt))
    cache = KVCache.allocate(cfg.num_hidden_layers, 8, 4, cfg.num_key_value_heads, cfg.head_dim)
    return model.forward(ForwardBatch.from_chunks([ScheduledChunk(seq, len(prompt))], 4), cache)


def _write_checkpoint(directory: Path, tied: bool, hf_config: dict[str, object]) -> LlamaModel:
    model, tensors = tiny_model(tie_word_embeddings=tied)
    directory.mkdir()
    half = len(tensors) // 2
    names = sorted(tensors)
    # Two shards, as large checkpoints come.
    save_file({n: tensors[n] for n in names[:half]}, str(directory / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[half:]}, str(directory / "model-00002-of-00002.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf_config))
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_sharded_checkpoint_loads_to_the_same_model(tmp_path: Path, tied: bool) -> None:
    hf = {k: v for k, v in tiny_config(tied).to_hf().items() if k != "head_dim"}
    hf["eos_token_id"] = 1  # HF allows an int as well as a list
    built = _write_checkpoint(tmp_path / "ckpt", tied, hf)
    (tmp_path / "ckpt" / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 5]}))
    loaded = load_model(tmp_path / "ckpt")
    assert loaded.config.eos_token_ids == (1, 5)
    assert loaded.config.head_dim == built.config.head_dim
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    np.testing.assert_array_equal(_logits(loaded, prompt), _logits(built, prompt))
    # The head is kept [hidden, vocab] and contiguous; a tied one is the embedding's one array.
    w = loaded.weights
    assert w.lm_head.shape == (loaded.config.hidden_size, loaded.config.vocab_size)
    assert w.lm_head.flags.c_contiguous
    assert w.tied is tied and np.shares_memory(w.lm_head, w.embed_tokens) is tied
    head_bytes = 0 if tied else w.lm_head.nbytes
    assert (
        w.resident_bytes - w.nbytes
        == head_bytes
        + w.embed_tokens.nbytes
        - w.lm_head.nbytes
        + sum(layer.input_norm.nbytes + layer.post_attention_norm.nbytes for layer in w.layers)
        + w.norm.nbytes
    )


def test_rope_scaling_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    hf = tiny_config().to_hf() | {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    _write_checkpoint(tmp_path / "ckpt", False, hf)
    with pytest.raises(ValueError, match="rope_scaling"):
        load_model(tmp_path / "ckpt")


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(tiny_config().to_hf()))
    save_file({"model.embed_tokens.weight": np.zeros((97, 32), np.float32)}, str(directory / "m.safetensors"))
    with pytest.raises(KeyError, match=r"model\.layers\.0\.input_layernorm\.weight"):
        load_model(directory)


def test_bfloat16_tensors_are_widened_exactly(tmp_path: Path) -> None:
    values = np.array([[1.0, -2.5, 3.140625], [0.0, 65280.0, -1e-3]], dtype=np.float32)
    halves = (values.view(np.uint32) >> 16).astype("<u2")  # bfloat16: the top 16 bits
    data = halves.tobytes()
    other = np.arange(3, dtype=np.float32)
    header = {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, len(data)]},
        "f": {"dtype": "F32", "shape": [3], "data_offsets": [len(data), len(data) + other.nbytes]},
    }
    raw_header = json.dumps(header).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(len(raw_header).to_bytes(8, "little") + raw_header + data + other.tobytes())
    tensors = load_safetensors(path)
    expected = (halves.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(tensors["w"], expected)
    np.testing.assert_allclose(tensors["w"], values, rtol=1e-2)
    np.testing.assert_array_equal(tensors["f"], other)
