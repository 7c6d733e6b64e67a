"""GGUF import on tiny files written by the gguf library itself: the import gives back the HF
tensors exactly (Q/K permutation undone, head tied), every supported type reads as the library
decodes it, and what we don't implement is refused by name."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter, RopeScalingType
from safetensors.numpy import load_file

from gpu_container.checkpoint.errors import CheckpointError, UnsupportedModel
from gpu_container.checkpoint.facts import read_facts
from gpu_container.checkpoint.gguf_import import import_gguf
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.checkpoint.tiny_gguf import HEADS, KV_HEADS, Q, write_tiny_gguf


def _import(tmp_path: Path, **kwargs: object) -> tuple[Path, dict[str, np.ndarray]]:
    source = tmp_path / "tiny.gguf"
    tensors = write_tiny_gguf(source, **kwargs)  # type: ignore[arg-type]
    return import_gguf(source, tmp_path / "models"), tensors


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_import_gives_back_the_hf_tensors_exactly(tmp_path: Path, tied: bool) -> None:
    directory, expected = _import(tmp_path, tied=tied)
    got = load_file(str(directory / "model.safetensors"))
    assert set(got) == set(expected)  # tied: no lm_head at all, not a second copy
    for name, value in expected.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    config = json.loads((directory / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (HEADS, KV_HEADS)
    assert config["eos_token_id"] == [2] and config["bos_token_id"] == 1
    facts = read_facts(directory)
    assert facts.eos_token_ids == (2,)
    assert facts.text.bos_token == "<|im_start|>" and facts.text.eos_token == "<|im_end|>"
    assert "<|im_start|>" in facts.text.chat_template
    assert facts.text.special_tokens == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    engine = LLMEngine.from_pretrained(directory, EngineConfig(num_blocks=8))
    assert engine.max_model_len == 128


def test_without_the_inverse_permutation_q_and_k_would_differ(tmp_path: Path) -> None:
    """Guards the test above: the permutation is not the identity on these shapes."""
    _, expected = _import(tmp_path)
    from tests.checkpoint.tiny_gguf import llama_cpp_permute

    q = expected["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(llama_cpp_permute(q, HEADS), q)


SUPPORTED = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K]


@pytest.mark.parametrize("kind", SUPPORTED, ids=lambda k: k.name)
def test_every_supported_type_reads_as_the_library_decodes_it(tmp_path: Path, kind: Q) -> None:
    directory, expected = _import(tmp_path, down_type=kind)
    name = "model.layers.0.mlp.down_proj.weight"
    np.testing.assert_array_equal(load_file(str(directory / "model.safetensors"))[name], expected[name])


def test_an_unsupported_type_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel, match=r"blk\.0\.ffn_down\.weight \(Q5_0\).*supported types: "):
        _import(tmp_path, down_type=Q.Q5_0)
    assert not any((tmp_path / "models").iterdir())


def test_another_architecture_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel, match="architecture 'qwen2' is not supported"):
        _import(tmp_path, arch="qwen2")


def test_rope_scaling_is_refused_by_name(tmp_path: Path) -> None:
    def scaled(writer: GGUFWriter) -> None:
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(4.0)

    with pytest.raises(UnsupportedModel, match=r"llama\.rope\.scaling\.type = 'linear' is not supported"):
        _import(tmp_path, extra=scaled)


def test_an_unknown_pre_tokenizer_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel, match=r"tokenizer\.ggml\.pre 'llama-bpe' is not supported"):
        _import(tmp_path, pre="llama-bpe")


@pytest.mark.parametrize(("pre", "digits"), [("smollm", ["1", "2"]), ("gpt2", ["12"])])
def test_the_pre_tokenizer_follows_tokenizer_ggml_pre(tmp_path: Path, pre: str, digits: list[str]) -> None:
    directory, _ = _import(tmp_path, pre=pre)
    tokenizer = read_facts(directory).text.tokenizer
    assert tokenizer.encode("12").tokens == digits
    encoding = tokenizer.encode(" the<|im_end|>", add_special_tokens=False)
    assert encoding.tokens == ["Ġthe", "<|im_end|>"] and encoding.ids[-1] == 2
    assert tokenizer.decode(encoding.ids) == " the"  # control tokens are skipped when decoding


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    data = source.read_bytes()
    source.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"tiny\.gguf: .*truncated"):
        import_gguf(source, tmp_path / "models")
    source.write_bytes(data[:100])  # cut inside the metadata
    with pytest.raises(CheckpointError, match=r"tiny\.gguf: not a readable GGUF file"):
        import_gguf(source, tmp_path / "models")
    assert not any((tmp_path / "models").iterdir())


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    with pytest.raises(CheckpointError, match=r"model\.gguf: not a readable GGUF file"):
        import_gguf(source, tmp_path / "models")


def test_reimport_is_a_cache_hit_and_a_changed_file_a_new_entry(tmp_path: Path) -> None:
    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    calls: list[int] = []
    first = import_gguf(source, tmp_path / "models", progress=lambda done, total, name: calls.append(done))
    assert calls and calls[-1] == len(calls)  # one report per tensor, up to the total
    record = (first / "import.json").stat().st_mtime_ns
    calls.clear()
    assert import_gguf(source, tmp_path / "models", progress=lambda *a: calls.append(1)) == first
    assert calls == [] and (first / "import.json").stat().st_mtime_ns == record
    write_tiny_gguf(source, seed=1)
    second = import_gguf(source, tmp_path / "models")
    assert second != first and second.name.startswith("tiny-")


def test_every_file_of_the_import_is_readable_by_every_user_of_the_cache(tmp_path: Path) -> None:
    """The import's directory is opened to every user (0755, whatever the umask): a cache imported
    once by one account (`floodgate model import` as root, a shared `models_dir`) serves the others.
    Its weights were 0600 all the same (safetensors writes its file private), so another user's
    `serve` found the checkpoint and its tokenizer but could not open the weights."""
    directory, _ = _import(tmp_path)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()}
    assert "model.safetensors" in modes
    assert {name: mode & 0o444 for name, mode in modes.items()} == dict.fromkeys(modes, 0o444)
