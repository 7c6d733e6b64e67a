"""Loading a Hugging Face-style directory gives the same model as building it from the tensors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from gpu_container.checkpoint.errors import UnsupportedModel
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
from tests.support.smollm2 import smollm2_dir


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
    """A CheckpointError, as load_model promises (a bare KeyError before, a traceback at start)."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(tiny_config().to_hf()))
    save_file({"model.embed_tokens.weight": np.zeros((97, 32), np.float32)}, str(directory / "m.safetensors"))
    with pytest.raises(UnsupportedModel, match=r"model\.layers\.0\.input_layernorm\.weight"):
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


def _layer0(name: str) -> str:
    return f"model.layers.0.{name}"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        # Qwen2's q/k/v biases (its tensors are otherwise named as Llama's), Qwen3's q/k norms,
        # Gemma 2's extra norms: each dropped would load another model than the checkpoint's.
        ({_layer0("self_attn.q_proj.bias"): (32,), _layer0("self_attn.k_proj.bias"): (16,)}, "q_proj.bias"),
        ({_layer0("self_attn.q_norm.weight"): (8,)}, "q_norm"),
        ({_layer0("pre_feedforward_layernorm.weight"): (32,)}, "pre_feedforward_layernorm"),
    ],
    ids=["qwen2-biases", "qwen3-qk-norm", "gemma2-norms"],
)
def test_tensors_a_llama_has_no_place_for_are_refused(
    tmp_path: Path, extra: dict[str, tuple[int, ...]], named: str
) -> None:
    directory = tmp_path / "ckpt"
    _write_checkpoint(directory, False, tiny_config().to_hf())
    extra_tensors = {n: np.ones(shape, np.float32) for n, shape in extra.items()}
    save_file(extra_tensors, str(directory / "extra.safetensors"))
    with pytest.raises(UnsupportedModel, match=named):
        load_model(directory)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act"),  # Gemma: Llama's tensor names, GELU
        ({"hidden_activation": "gelu_pytorch_tanh"}, "hidden_activation"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
    ids=["hidden-act", "hidden-activation", "attention-bias", "mlp-bias"],
)
def test_config_settings_a_llama_lacks_are_refused(
    tmp_path: Path, setting: dict[str, object], named: str
) -> None:
    _write_checkpoint(tmp_path / "ckpt", False, tiny_config().to_hf() | setting)
    with pytest.raises(UnsupportedModel, match=named):
        load_model(tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("setting", "positions"),
    [
        ({"sliding_window": None, "attention_bias": False, "mlp_bias": False}, 512),  # Mistral v0.2
        ({"sliding_window": 64, "use_sliding_window": False}, 512),  # Qwen2: a window it does not use
        ({"sliding_window": 1024}, 512),  # longer than the model's positions: every token in it
        ({"hidden_act": "swish"}, 512),  # SiLU under its other name in transformers
        # Mistral 7B v0.1's: within its window the model attends to every earlier token, as here;
        # the context stops there (the engine's max_model_len and the edge's follow it), where
        # loaded whole a longer one was computed over tokens the model never sees.
        ({"sliding_window": 64}, 64),
    ],
    ids=["none", "unused", "longer", "swish", "in-use"],
)
def test_plain_llama_checkpoints_still_load(
    tmp_path: Path, setting: dict[str, object], positions: int
) -> None:
    directory = tmp_path / "ckpt"
    built = _write_checkpoint(directory, False, tiny_config().to_hf() | setting)
    # Older Hugging Face conversions saved RoPE's frequencies as a buffer: recomputed, not needed.
    buffer = {_layer0("self_attn.rotary_emb.inv_freq"): np.ones(4, np.float32)}
    save_file(buffer, str(directory / "buffer.safetensors"))
    loaded = load_model(directory)
    assert loaded.config.max_position_embeddings == positions
    prompt = [3, 1, 4, 1, 5]
    np.testing.assert_array_equal(_logits(loaded, prompt), _logits(built, prompt))


# In a process of its own: the memory it holds once the real model is loaded, less what it held
# before, against the size of the weights it loaded.
_HELD_AFTER_LOAD = """
import json, sys
from pathlib import Path
from gpu_container.engine.loader import load_model


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


before = rss()
model = load_model(sys.argv[1])
weights = sum(p.stat().st_size for p in Path(sys.argv[1]).glob("*.safetensors"))
print(json.dumps({"held": rss() - before, "weights": weights}))
"""


def test_the_real_models_load_leaves_the_engine_holding_its_weights_not_the_loads_leftovers() -> None:
    """The tensors read from the file are copied into the model's layout and dropped, and glibc's
    malloc kept what they freed: the real model's engine held about 980 MB past its start against
    540 MB of weights, half a gigabyte a process for its whole life. Given back now."""
    if not Path("/proc/self/status").exists():
        pytest.skip("NOT RUN: reads the process's memory from /proc")
    model_dir = smollm2_dir()
    probe = subprocess.run(
        [sys.executable, "-c", _HELD_AFTER_LOAD, str(model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    held = json.loads(probe.stdout)
    # Room for the model's own buffers beside its weights, far short of the leftovers' 440 MB.
    assert held["held"] < held["weights"] + 150 * 2**20, held
