"""The demo checkpoint: deterministic bytes, safe under racing builders, a real ChatML tokenizer."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jinja2
from tokenizers import Tokenizer

from gpu_container.engine.demo_model import FILES, build_demo_model


def _id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    assert token_id is not None
    return token_id


def _digests(directory: Path) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in FILES}


def test_build_is_byte_identical_and_skips_a_complete_directory(demo_dir: Path, tmp_path: Path) -> None:
    again = build_demo_model(tmp_path / "again")
    assert _digests(again) == _digests(demo_dir)
    before = {name: (again / name).stat().st_mtime_ns for name in FILES}
    assert build_demo_model(again) == again
    assert {name: (again / name).stat().st_mtime_ns for name in FILES} == before


def test_racing_builders_all_get_one_complete_copy(demo_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "shared" / "demo"
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: build_demo_model(target), range(6)))
    assert results == [target] * 6
    assert _digests(target) == _digests(demo_dir)
    assert [p.name for p in target.parent.iterdir()] == ["demo"]  # no staging dirs left behind


def test_a_partial_directory_is_replaced(demo_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "partial"
    target.mkdir()
    (target / "config.json").write_text("{}")
    build_demo_model(target)
    assert _digests(target) == _digests(demo_dir)


def test_tokenizer_and_chat_template_are_chatml(demo_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(demo_dir / "tokenizer.json"))
    config = json.loads((demo_dir / "config.json").read_text())
    tok_config = json.loads((demo_dir / "tokenizer_config.json").read_text())
    im_end, eot = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    assert config["eos_token_id"] == [im_end, eot]
    assert config["vocab_size"] == tokenizer.get_vocab_size() >= 1000
    assert tok_config["eos_token"] == "<|im_end|>" and tok_config["bos_token"] == "<|endoftext|>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🌊"}]
    rendered = (
        jinja2.Environment()
        .from_string(tok_config["chat_template"])
        .render(messages=messages, add_generation_prompt=True)
    )
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 🌊<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode(rendered).ids
    assert ids.count(_id(tokenizer, "<|im_start|>")) == 3 and ids.count(_id(tokenizer, "<|im_end|>")) == 2
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered


def test_vocabulary_has_whole_multibyte_characters(demo_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(demo_dir / "tokenizer.json"))
    pieces = [tokenizer.decode([i]) for i in range(tokenizer.get_vocab_size())]
    whole = {p for p in pieces if "\ufffd" not in p and any(ord(c) > 127 for c in p)}
    assert {"好", "水"} <= whole and any(ord(c) > 0xFFFF for p in whole for c in p)  # CJK and emoji
