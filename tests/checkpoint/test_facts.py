"""One reader of a checkpoint's facts; a broken or partial directory fails with the file's name
(where a bare `Exception: No such file or directory (os error 2)` came before)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from edge.text.model_text import ModelText
from gpu_container.checkpoint.errors import CheckpointError
from gpu_container.checkpoint.facts import CHATML, read_facts
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.support.live_server import demo_model_dir


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(demo_model_dir(), directory)
    return directory


def test_the_demo_model_facts(checkpoint: Path) -> None:
    facts = read_facts(checkpoint)
    tokenizer = facts.text.tokenizer
    # config.json lists <|im_end|> then <|endoftext|>; tokenizer_config's eos_token adds nothing new.
    assert facts.eos_token_ids == (
        tokenizer.token_to_id("<|im_end|>"),
        tokenizer.token_to_id("<|endoftext|>"),
    )
    assert facts.max_context == 4096
    assert facts.text.eos_token == "<|im_end|>" and facts.text.bos_token == "<|endoftext|>"
    assert set(facts.text.special_tokens) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    assert ModelText.load(checkpoint).eos_token_ids == list(facts.eos_token_ids)


def test_eos_ids_merge_every_file_that_names_them(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"eos_token_id": 7}))
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    facts = read_facts(checkpoint)
    im_end = facts.text.tokenizer.token_to_id("<|im_end|>")
    assert facts.eos_token_ids == (7, 9, im_end)
    engine = LLMEngine.from_pretrained(checkpoint, EngineConfig(num_blocks=8))
    assert engine._model.config.eos_token_ids == (7, 9, im_end)  # the engine asks the same reader


def test_tensorrt_llms_end_id_is_the_tokenizers_eos_token(checkpoint: Path) -> None:
    """As tensorrtllm_backend's preprocessing takes it, not config.json's first end token (Llama 3.1
    Instruct lists <|end_of_text|> first; its tokenizer's eos_token <|eot_id|> ends a chat turn)."""
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"eos_token_id": [7, 9]}))
    facts = read_facts(checkpoint)
    im_end = facts.text.tokenizer.token_to_id("<|im_end|>")
    assert facts.eos_token_ids[0] == 7 and facts.end_id == im_end

    tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    del tokenizer_config["eos_token"]
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert read_facts(checkpoint).end_id == 7  # no eos_token of its own: the first end token


def test_missing_tokenizer_json_is_named(checkpoint: Path) -> None:
    (checkpoint / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"ckpt/tokenizer\.json: missing"):
        ModelText.load(checkpoint)


def test_a_bad_tokenizer_json_is_named(checkpoint: Path) -> None:
    (checkpoint / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(CheckpointError, match=r"ckpt/tokenizer\.json: not a readable tokenizer"):
        read_facts(checkpoint)


def test_missing_config_json_is_named(checkpoint: Path) -> None:
    (checkpoint / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"ckpt/config\.json: missing"):
        LLMEngine.from_pretrained(checkpoint, EngineConfig(num_blocks=8))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"vocab_size": ', r"config\.json: not valid JSON"),
        ("[1, 2]", r"config\.json: expected a JSON object"),
        ('{"vocab_size": 10}', r"config\.json: missing key 'num_attention_heads'"),
    ],
)
def test_a_bad_config_json_is_named(checkpoint: Path, text: str, message: str) -> None:
    (checkpoint / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=message):
        ModelText.load(checkpoint)


def test_a_bad_tokenizer_config_json_is_named(checkpoint: Path) -> None:
    (checkpoint / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: not valid JSON"):
        ModelText.load(checkpoint)


def test_no_weights_is_named_but_the_text_side_needs_none(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors").unlink()
    # An edge in front of remote replicas holds config and tokenizer only (Dockerfile.edge).
    assert ModelText.load(checkpoint).encode_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(CheckpointError, match=r"ckpt: no \*\.safetensors weight file"):
        LLMEngine.from_pretrained(checkpoint, EngineConfig(num_blocks=8))


def test_a_corrupt_safetensors_file_is_named(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        LLMEngine.from_pretrained(checkpoint, EngineConfig(num_blocks=8))


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nowhere: no such checkpoint directory"):
        ModelText.load(tmp_path / "nowhere")


def _without_config_template(checkpoint: Path) -> None:
    tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    del tokenizer_config["chat_template"]
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


# Renders what ChatML never would, so a ChatML fallback cannot pass for it.
OWN_TEMPLATE = (
    "{% for message in messages %}[{{ message['role'] | upper }}] {{ message['content'] }}\n{% endfor %}"
)


@pytest.mark.parametrize("name", ["chat_template.jinja", "chat_templates/default.jinja"])
def test_a_template_saved_in_its_own_file_is_the_models(checkpoint: Path, name: str) -> None:
    """Current transformers saves the template beside tokenizer_config.json, not in it."""
    _without_config_template(checkpoint)
    (checkpoint / name).parent.mkdir(exist_ok=True)
    (checkpoint / name).write_text(OWN_TEMPLATE)
    with capture_logs() as logs:
        text = ModelText.load(checkpoint)
    assert text.template.render([{"role": "user", "content": "hi"}]) == "[USER] hi\n"
    assert logs == []


def test_tokenizer_configs_template_comes_before_the_files(checkpoint: Path) -> None:
    (checkpoint / "chat_template.jinja").write_text(OWN_TEMPLATE)
    rendered = ModelText.load(checkpoint).template.render([{"role": "user", "content": "hi"}])
    assert rendered.startswith("<|im_start|>user\nhi<|im_end|>")


def test_no_template_anywhere_is_chatml_with_a_warning(checkpoint: Path) -> None:
    _without_config_template(checkpoint)
    with capture_logs() as logs:
        facts = read_facts(checkpoint)
    assert facts.text.chat_template == CHATML
    assert [entry["log_level"] for entry in logs] == ["warning"]
    assert logs[0]["directory"] == str(checkpoint)
