"""edge/text/piece_cache.py: a prompt's ids from kept pieces equal the tokenizer's own encoding of
the whole text, on both models' tokenizers, whatever sits around the special tokens; a piece kept
for one scope never serves another; the cache stays within its bound; a tokenizer whose added tokens
eat their neighbours' whitespace gets no cache."""

from __future__ import annotations

import random
import re
import threading
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from edge.text.piece_cache import ENTRY_BYTES, PieceCache
from tests.support.live_server import demo_model_dir
from tests.support.smollm2 import smollm2_dir

ALPHABET = [*"ab xyz  \n\t\t0123456789.,!?'’éü中文😀👍🏽", " the", " token", "\n\n", "  "]


def _tokenizer(which: str) -> Tokenizer:
    directory = demo_model_dir() if which == "demo" else smollm2_dir()
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def _random_text(rng: random.Random, specials: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(0, 40)):
        parts.append(rng.choice(specials) if rng.random() < 0.15 else rng.choice(ALPHABET))
    return "".join(parts)


class _CountingTokenizer:
    """The real tokenizer, listing the pieces between added tokens it was asked to encode."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder().values()
        self.split = re.compile("|".join(re.escape(t.content) for t in added))
        self.encoded: list[str] = []

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> Any:
        self.encoded += [piece for text in texts for piece in self.split.split(text)]
        return self.tokenizer.encode_batch_fast(texts, add_special_tokens=add_special_tokens)


def _counting_cache(tokenizer: Tokenizer, max_bytes: int = 10**6) -> tuple[PieceCache, _CountingTokenizer]:
    counting = _CountingTokenizer(tokenizer)
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    return PieceCache(counting, added, max_bytes), counting  # type: ignore[arg-type]


@pytest.mark.parametrize("which", ["demo", "real"])
def test_ids_from_kept_pieces_are_the_tokenizers_own(which: str) -> None:
    tokenizer = _tokenizer(which)
    cache = PieceCache.build(tokenizer)
    assert cache is not None, "ChatML tokenizers without stripping added tokens: the cache applies"
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    rng = random.Random(7)
    texts = [_random_text(rng, specials) for _ in range(400)]
    for rounds in range(2):  # first every piece is new, then most are kept
        for text in texts:
            expected = tokenizer.encode(text, add_special_tokens=False).ids
            assert cache.encode(text, "user-a") == expected, (rounds, text)
    assert cache.size > 0


def test_a_piece_kept_for_one_scope_is_encoded_again_for_another() -> None:
    cache, counting = _counting_cache(_tokenizer("demo"))
    text = "<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    first = cache.encode(text, "alice")
    assert counting.encoded == ["system\nYou answer briefly.", "\n", "user\nHi"]
    assert cache.encode(text, "alice") == first
    assert counting.encoded == ["system\nYou answer briefly.", "\n", "user\nHi"], "all kept for alice"
    assert cache.encode(text, "bob") == first
    assert counting.encoded[3:] == counting.encoded[:3], "nothing of alice's for bob"


def test_the_next_turn_encodes_only_what_is_new() -> None:
    cache, counting = _counting_cache(_tokenizer("real"))
    history = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n"
    cache.encode(history + "<|im_start|>assistant\n", "u")
    counting.encoded.clear()
    turn = history + "<|im_start|>assistant\nSeven.<|im_end|>\n<|im_start|>user\nAnother?<|im_end|>\n"
    cache.encode(turn + "<|im_start|>assistant\n", "u")
    assert counting.encoded == ["assistant\nSeven.", "user\nAnother?"]


def test_the_cache_keeps_within_its_bound_dropping_the_least_recently_used() -> None:
    bound = 3 * (ENTRY_BYTES + 80)  # three of these pieces, not four
    cache, counting = _counting_cache(_tokenizer("demo"), max_bytes=bound)
    pieces = [f"piece number {i} " * 2 for i in range(20)]  # 32-34 characters, under 12 tokens each
    for piece in pieces[:3]:
        cache.encode(piece, "")
        assert cache.size <= bound
    cache.encode(pieces[0], "")  # used again: the oldest is now pieces[1]
    cache.encode(pieces[3], "")
    assert cache.size <= bound
    counting.encoded.clear()
    cache.encode(pieces[0], "")
    assert counting.encoded == [], "recently used: still kept"
    cache.encode(pieces[1], "")
    assert counting.encoded == [pieces[1]], "least recently used: dropped"
    for piece in pieces:
        cache.encode(piece, "")
        assert cache.size <= bound
    cache.encode("x" * bound, "")
    assert cache.size <= bound, "a piece over the whole bound is encoded, not kept"


def test_threads_sharing_the_cache_get_the_tokenizers_ids() -> None:
    tokenizer = _tokenizer("real")
    cache = PieceCache.build(tokenizer, max_bytes=3000)  # small: evictions race with lookups
    assert cache is not None
    rng = random.Random(3)
    specials = ["<|im_start|>", "<|im_end|>"]
    texts = [_random_text(rng, specials) for _ in range(60)]
    expected = {text: tokenizer.encode(text, add_special_tokens=False).ids for text in texts}
    wrong: list[str] = []

    def work(seed: int) -> None:
        order = random.Random(seed)
        for _ in range(400):
            text = order.choice(texts)
            if cache.encode(text, str(seed % 2)) != expected[text]:
                wrong.append(text)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_added_tokens_that_strip_whitespace_get_no_cache() -> None:
    tokenizer = _tokenizer("demo")
    tokenizer.add_special_tokens([AddedToken("<tool>", lstrip=True, rstrip=True)])
    text = "call  <tool>  now"
    pieces_sum = [
        *tokenizer.encode("call  ", add_special_tokens=False).ids,
        tokenizer.token_to_id("<tool>"),
        *tokenizer.encode("  now", add_special_tokens=False).ids,
    ]
    assert tokenizer.encode(text, add_special_tokens=False).ids != pieces_sum, "the pieces would be wrong"
    assert PieceCache.build(tokenizer) is None


def test_a_tokenizer_that_encodes_a_piece_by_where_it_sits_gets_no_cache() -> None:
    """A Metaspace pre-tokenizer that marks only the text's first word: "hi" is "▁hi" at the
    start and "hi" after a special token, so a piece kept from one place is wrong in another."""
    vocab = {"▁hi": 0, "hi": 1, "<sep>": 2, "[UNK]": 3, "▁x": 4, "x": 5, "▁y": 6, "y": 7}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.add_special_tokens(["<sep>"])
    assert tokenizer.encode("hi<sep>hi", add_special_tokens=False).ids == [0, 2, 1]
    assert tokenizer.encode("hi", add_special_tokens=False).ids == [0], "alone it is the first word"
    assert PieceCache.build(tokenizer) is None
