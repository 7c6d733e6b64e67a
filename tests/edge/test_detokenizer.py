"""Incremental detokenizing with the demo model's byte-level BPE tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from edge.text.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from tests.support.live_server import demo_model_dir

TEXTS = [
    "Hello world, how are you?",
    "Emoji 😀👍🏽 and flags 🇫🇷 mid-sentence",
    "中文字符和日本語のテキスト、그리고 한국어",
    "mixed: café ☕ naïve — “quotes” ∑∫ 🧪 end",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))


def _stream(tokenizer: Tokenizer, ids: list[int], step: int) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_pieces_add_up_and_never_split_a_character(tokenizer: Tokenizer, text: str, step: int) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = _stream(tokenizer, ids, step)
    assert "".join(pieces) == text
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_multibyte_characters_really_span_several_tokens(tokenizer: Tokenizer) -> None:
    # Guards the test above: with byte-level BPE an emoji is several tokens, held until complete.
    ids = tokenizer.encode("😀", add_special_tokens=False).ids
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push([ids[-1]]) == "😀"


def test_special_tokens_are_not_emitted(tokenizer: Tokenizer) -> None:
    eos = tokenizer.token_to_id("<|im_end|>")
    assert eos is not None
    ids = tokenizer.encode("done", add_special_tokens=False).ids
    assert "".join(_stream(tokenizer, [*ids, eos], 1)) == "done"


def test_text_after_invalid_bytes_streams_and_the_bytes_show_as_replacements(tokenizer: Tokenizer) -> None:
    # A lone UTF-8 lead byte (0xC3, "Ã" in the byte-level alphabet) then plain text: the text
    # must come out as it arrives, the bad byte as U+FFFD, as a full decode renders it.
    lead = tokenizer.token_to_id("Ã")
    assert lead is not None
    words = tokenizer.encode(" and then some more words", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    streamed = [detok.push([i]) for i in [lead, *words]]
    assert streamed[0] == ""
    assert "".join(streamed) == tokenizer.decode([lead, *words])
    assert detok.flush() == ""


def test_a_dangling_partial_character_comes_out_on_flush(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 😀", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.push([i]) for i in ids[:-1]) == "ok "
    assert detok.flush() == REPLACEMENT_CHAR


@pytest.mark.parametrize("step", [1, 2, 5])
def test_a_long_reply_streams_whole_while_the_decode_window_moves_up(tokenizer: Tokenizer, step: int) -> None:
    # Far more tokens than the decode window holds: the window moves many times, mid-character too.
    text = " ".join(TEXTS) * 4
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) > 100
    pieces = _stream(tokenizer, ids, step)
    assert "".join(pieces) == text
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)
