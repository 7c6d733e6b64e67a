"""Incremental detokenizing with the demo model's byte-level BPE tokenizer and the real model's,
by both detokenizers: the decode window that asks the tokenizer (any tokenizer) and the byte table
(byte-level BPE only, edge/text/byte_pieces.py)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from edge.text.byte_pieces import byte_pieces
from edge.text.chat_template import ChatTemplate
from edge.text.detokenizer import (
    REPLACEMENT_CHAR,
    Detokenizer,
    IncrementalDetokenizer,
    LeavingOut,
    PiecesDetokenizer,
    PieceTable,
)
from edge.text.model_text import ModelText
from tests.support.live_server import demo_model_dir
from tests.support.smollm2 import smollm2_dir

MakeDetokenizer = Callable[[], Detokenizer]

TEXTS = [
    "Hello world, how are you?",
    "Emoji 😀👍🏽 and flags 🇫🇷 mid-sentence",
    "中文字符和日本語のテキスト、그리고 한국어",
    "mixed: café ☕ naïve — “quotes” ∑∫ 🧪 end",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))


@pytest.fixture(scope="module")
def real_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_dir() / "tokenizer.json"))


def _factory(tokenizer: Tokenizer, kind: str) -> MakeDetokenizer:
    if kind == "window":
        return lambda: IncrementalDetokenizer(tokenizer)
    pieces = byte_pieces(tokenizer)
    assert pieces is not None, "byte-level BPE: the table applies"
    table = PieceTable(pieces)
    return lambda: PiecesDetokenizer(table)


@pytest.fixture(scope="module", params=["window", "pieces"])
def make(request: pytest.FixtureRequest, tokenizer: Tokenizer) -> MakeDetokenizer:
    return _factory(tokenizer, request.param)


def _stream(make: MakeDetokenizer, ids: list[int], step: int) -> list[str]:
    detok = make()
    pieces = [detok.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_pieces_add_up_and_never_split_a_character(
    tokenizer: Tokenizer, make: MakeDetokenizer, text: str, step: int
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = _stream(make, ids, step)
    assert "".join(pieces) == text
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_multibyte_characters_really_span_several_tokens(tokenizer: Tokenizer, make: MakeDetokenizer) -> None:
    # Guards the test above: with byte-level BPE an emoji is several tokens, held until complete.
    ids = tokenizer.encode("😀", add_special_tokens=False).ids
    assert len(ids) > 1
    detok = make()
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push([ids[-1]]) == "😀"


def test_special_tokens_are_not_emitted(tokenizer: Tokenizer, make: MakeDetokenizer) -> None:
    eos = tokenizer.token_to_id("<|im_end|>")
    assert eos is not None
    ids = tokenizer.encode("done", add_special_tokens=False).ids
    assert "".join(_stream(make, [*ids, eos], 1)) == "done"


def test_text_after_invalid_bytes_streams_and_the_bytes_show_as_replacements(
    tokenizer: Tokenizer, make: MakeDetokenizer
) -> None:
    # A lone UTF-8 lead byte (0xC3, "Ã" in the byte-level alphabet) then plain text: the text
    # must come out as it arrives, the bad byte as U+FFFD, as a full decode renders it.
    lead = tokenizer.token_to_id("Ã")
    assert lead is not None
    words = tokenizer.encode(" and then some more words", add_special_tokens=False).ids
    detok = make()
    streamed = [detok.push([i]) for i in [lead, *words]]
    assert streamed[0] == ""
    assert "".join(streamed) == tokenizer.decode([lead, *words])
    assert detok.flush() == ""


@pytest.mark.parametrize("which", ["demo", "real"])
def test_a_character_cut_off_at_the_end_is_dropped_not_replaced(
    tokenizer: Tokenizer, real_tokenizer: Tokenizer, which: str
) -> None:
    """A reply cut by max_tokens inside an emoji or a CJK character ends at the last whole character,
    as vLLM's does: a trailing U+FFFD went into the client's history and back to the model."""
    tok = tokenizer if which == "demo" else real_tokenizer
    for kind in ("window", "pieces"):
        for text in ("ok 😀", "好的，更感谢"):
            ids = tok.encode(text, add_special_tokens=False).ids
            detok = _factory(tok, kind)()
            streamed = "".join(detok.push([i]) for i in ids[:-1])
            assert streamed + detok.flush() == text[:-1], (kind, text)


@pytest.mark.parametrize("step", [1, 2, 5])
def test_a_long_reply_streams_whole_while_the_decode_window_moves_up(
    tokenizer: Tokenizer, make: MakeDetokenizer, step: int
) -> None:
    # Far more tokens than the decode window holds: the window moves many times, mid-character too.
    text = " ".join(TEXTS) * 4
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) > 100
    pieces = _stream(make, ids, step)
    assert "".join(pieces) == text
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


@pytest.mark.parametrize("kind", ["window", "pieces"])
@pytest.mark.parametrize("which", ["demo", "real"])
def test_any_token_sequence_streams_as_the_tokenizer_decodes_it_whole(
    tokenizer: Tokenizer, real_tokenizer: Tokenizer, which: str, kind: str
) -> None:
    """Token ids drawn at random from the whole vocabulary (a sampling model can emit any): broken
    characters, special tokens and plain words mixed, pushed in deltas of 1-4 tokens. What the
    stream shows in the end is what the tokenizer makes of the whole sequence, a character cut off
    at its end aside."""
    tok = tokenizer if which == "demo" else real_tokenizer
    make = _factory(tok, kind)
    rng = random.Random(20261201)
    size = tok.get_vocab_size(with_added_tokens=True)
    for _ in range(200):
        ids = [rng.randrange(size) for _ in range(rng.randrange(1, 40))]
        detok = make()
        streamed, at = [], 0
        while at < len(ids):
            step = rng.randrange(1, 5)
            streamed.append(detok.push(ids[at : at + step]))
            at += step
        streamed.append(detok.flush())
        whole, got = tok.decode(ids), "".join(streamed)
        # All of it, but for replacement characters at the very end (a character cut off there).
        assert whole.startswith(got) and whole.rstrip(REPLACEMENT_CHAR) == got.rstrip(REPLACEMENT_CHAR)


def test_the_real_models_tokenizer_gets_the_byte_table(real_tokenizer: Tokenizer) -> None:
    pieces = byte_pieces(real_tokenizer)
    assert pieces is not None
    assert len(pieces) == real_tokenizer.get_vocab_size(with_added_tokens=True)
    assert pieces[real_tokenizer.token_to_id("<|im_end|>")] == b""  # special: skipped
    # " café" spelled in the byte-level alphabet, read back as the bytes of the text.
    ids = real_tokenizer.encode(" café", add_special_tokens=False).ids
    assert b"".join(pieces[i] for i in ids) == " café".encode()


def test_a_tokenizer_whose_decoding_is_not_byte_level_gets_no_table() -> None:
    """A SentencePiece-style decoder renders a token by its neighbours: the window stays."""
    vocab = {"<unk>": 0, "▁hello": 1, "▁world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    assert byte_pieces(tok) is None
    detok = IncrementalDetokenizer(tok)
    assert detok.push([1]) + detok.push([2]) + detok.flush() == tok.decode([1, 2]) == "hello world"


@pytest.mark.parametrize("kind", ["window", "table"])
def test_a_left_out_token_adds_no_text_wherever_it_comes(tokenizer: Tokenizer, kind: str) -> None:
    """A request's stop_token_ids: the token that ended the reply is not part of its text, whether
    it comes last in its push or a replica sent it before the push that ends the stream."""
    make = _factory(tokenizer, kind)
    ids = tokenizer.encode("Hello world, how are you?").ids
    stop = ids[3]
    expected = tokenizer.decode(ids[:3])
    alone = LeavingOut(make(), frozenset({stop}))
    assert alone.push(ids[:2]) + alone.push([ids[2], stop]) + alone.flush() == expected
    split = LeavingOut(make(), frozenset({stop}))
    assert split.push(ids[:3]) + split.push([stop]) + split.push([]) + split.flush() == expected


def _llama2_style_tokenizer() -> Tokenizer:
    """SentencePiece as Llama 2 converts: Metaspace words, byte fallback, and a decoder that strips
    the first token's leading space."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁Hello": 3, "▁world": 4, "!": 5}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return tok


@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize(
    "prompt",
    [
        ["<s>", "▁Hello"],
        ["▁world", "!", "</s>", "<s>", "▁Hello"],
        ["▁world", "!", "▁world", "!", "▁world", "!", "▁Hello"],
    ],
)
def test_a_continued_messages_reply_keeps_the_space_before_its_first_word(
    step: int, prompt: list[str]
) -> None:
    """continue_final_message: the reply goes on from the prompt's last word. Decoded alone, its
    first word lost its space to the Strip decoder: 'Hello' continued as 'Helloworld!'."""
    tok = _llama2_style_tokenizer()
    vocab = tok.get_vocab(with_added_tokens=True)
    text = ModelText(
        tok, ChatTemplate("{{ messages[0]['content'] }}", bos_token="<s>", eos_token="</s>"), [2]
    )
    prompt_ids = [vocab[token] for token in prompt]
    reply = [vocab[token] for token in ["▁world", "!", "▁Hello"]]
    assert tok.decode(prompt_ids[-1:] + reply) == "Hello world! Hello"
    assert "".join(_stream(lambda: text.detokenizer(context=prompt_ids), reply, step)) == " world! Hello"
    # A new turn's reply begins as the whole decode of the reply alone does.
    assert "".join(_stream(text.detokenizer, reply, step)) == tok.decode(reply) == "world! Hello"


@pytest.mark.parametrize("step", [1, 2, 3])
def test_a_word_after_a_skipped_special_token_keeps_its_space(step: int) -> None:
    """The window once started at the skipped </s>, and the Strip decoder took the next word's
    space: 'Helloworld' streamed where the whole decode says 'Hello world'."""
    tok = _llama2_style_tokenizer()
    assert byte_pieces(tok) is None
    tokens = ["▁Hello", "▁world", "!", "▁Hello", "</s>", "▁world", "▁Hello", "<s>", "<s>", "▁world", "!"]
    vocab = tok.get_vocab(with_added_tokens=True)
    ids = [vocab[token] for token in tokens]
    whole = tok.decode(ids, skip_special_tokens=True)
    assert whole == "Hello world! Hello world Hello world!"
    given = frozenset({vocab["<s>"], vocab["</s>"]})
    for make in (lambda: IncrementalDetokenizer(tok), lambda: IncrementalDetokenizer(tok, special_ids=given)):
        assert "".join(_stream(make, ids, step)) == whole


@pytest.mark.parametrize("then", ["", " ok"])
def test_a_surrogates_bytes_show_at_once_as_the_tokenizer_decodes_them(
    real_tokenizer: Tokenizer, then: str
) -> None:
    """ED A0-BF starts the encoding of a surrogate, which UTF-8 never holds: no byte after it makes
    a character, so the tokenizer decodes it as two U+FFFD on the spot. Python's UTF-8 decoder
    waited for a third byte, so the stream showed them a token late, and a reply ending there
    never showed them at all."""
    table = PieceTable(byte_pieces(real_tokenizer) or [])
    # The byte-level alphabet spells bytes ED and A5 as "í" and "¥": one token each.
    (word,) = real_tokenizer.encode(" word", add_special_tokens=False).ids
    ids = [word, real_tokenizer.token_to_id("í"), real_tokenizer.token_to_id("¥")]
    ids += real_tokenizer.encode(then, add_special_tokens=False).ids
    detok = PiecesDetokenizer(table)
    deltas = [detok.push([i]) for i in ids]
    assert deltas[:3] == [" word", "", REPLACEMENT_CHAR * 2]
    whole = real_tokenizer.decode(ids)
    assert "".join(deltas) + detok.flush() == whole == " word" + REPLACEMENT_CHAR * 2 + then
