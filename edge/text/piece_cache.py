"""A prompt's token ids put together from its pieces between added tokens, each piece's ids kept.

Why: the tokenizer's cost is its pre-tokenizer (byte-level BPE's regex: about 2 µs a word on these
cores, 16 µs for a seven-word sentence, 4-5 ms for a 2,000-token conversation), paid on every
request's set-up, and a chat sends the same text again and again: the same system prompt with every
request of an app, the whole history with every turn, the template's own "\\n" and "assistant\\n"
with every request of everyone. One stream's set-up spent about a sixth of its CPU there
(docs/bench-streams.md, tenth pass).

Exact by construction: a Hugging Face tokenizer first splits its input at its added tokens (its
special tokens among them) and encodes each piece between them alone (AddedVocabulary's
extract_and_normalize), so a text's ids are its pieces' ids and its added tokens' ids in order.
That holds when no added token eats the whitespace beside it (lstrip/rstrip), matches only whole
words (single_word) or is matched after a normalizer, and when a piece's encoding does not depend
on where it sits (a Metaspace pre-tokenizer that marks only the text's first word does: "hi" is
"▁hi" at the start, "hi" after a special token). `build` checks those flags and then encodes texts
that put every added token against spaces, newlines, digits, letters and each other, three ways:
whole, piece by piece (each piece alone, as a kept piece is reused anywhere) and through the cache;
any difference, and there is no cache (the caller encodes the whole text as before).

Whose: a piece is kept per cache scope, as the replicas' prefix caches are
(edge/admission/cache_scope.py): how long a request takes to encode must not tell one user what
another sent. Bounded in bytes (a piece's text, its ids as 4-byte integers and the entry's own
objects), least recently used first out.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict

from tokenizers import Tokenizer

from edge.text.added_tokens import added_token_pattern

# The system prompts and recent histories of a few thousand users.
MAX_CACHED_BYTES = 32 * 2**20
# What an entry costs beyond its text and ids: its key tuple, the string and array headers, the
# ordered dict's slot and link (tracemalloc, 20,000 one-line pieces: 277 bytes an entry in all).
ENTRY_BYTES = 170


def _size(piece: str, ids: array[int]) -> int:
    return ENTRY_BYTES + len(piece) + ids.itemsize * len(ids)


def _probes(added: list[str]) -> list[str]:
    """Texts where a wrong split would show: every added token against what sits beside it."""
    around = ["", " ", "  ", "\n", "\n\n", "a", " a", "a ", "7", " 12", "é", "\t"]
    texts = []
    for token in added:
        for before in around:
            for after in around:
                texts.append(f"x{before}{token}{after}y")
        texts.append(token + token)
        texts.append(f" {token} {token} ")
    texts.append("".join(added) + " Hello, world! 2024\n" + " ".join(added))
    return texts


class PieceCache:
    """`encode(text, scope)`: the tokenizer's ids of `text`, from kept pieces where it can."""

    def __init__(
        self, tokenizer: Tokenizer, added: dict[str, int], max_bytes: int = MAX_CACHED_BYTES
    ) -> None:
        self._tokenizer = tokenizer
        self._added = added
        self._split = added_token_pattern(added)
        self._joiner, self._joiner_id = next(iter(added.items()))
        self._max_bytes = max_bytes
        self._bytes = 0
        # Arrays, not tuples: one object per piece instead of one per token for the collector.
        self._kept: OrderedDict[tuple[str, str], array[int]] = OrderedDict()
        # Large prompts are encoded on worker threads (edge/prompt_encoding.py).
        self._lock = threading.Lock()

    @classmethod
    def build(cls, tokenizer: Tokenizer, max_bytes: int = MAX_CACHED_BYTES) -> PieceCache | None:
        """A cache for this tokenizer, or None when its encoding is not the sum of its pieces'."""
        tokens = tokenizer.get_added_tokens_decoder()
        if not tokens or tokenizer.encode_special_tokens:
            return None
        for token in tokens.values():
            if token.lstrip or token.rstrip or token.single_word or not token.content:
                return None
            if token.normalized and tokenizer.normalizer is not None:
                return None
        cache = cls(tokenizer, {t.content: i for i, t in tokens.items()}, max_bytes)
        for text in _probes(list(cache._added)):
            whole = tokenizer.encode(text, add_special_tokens=False).ids
            alone: list[int] = []
            for part in cache._parts(text):
                if isinstance(part, str):
                    alone += tokenizer.encode(part, add_special_tokens=False).ids
                elif isinstance(part, int):
                    alone.append(part)
            if alone != whole or cache.encode(text, "") != whole:
                return None
        cache.clear()
        return cache

    def _parts(self, text: str) -> list[int | str | array[int]]:
        """The text's pieces and, between them, its added tokens' ids."""
        parts: list[int | str | array[int]] = []
        start = 0
        for match in self._split.finditer(text):
            if match.start() > start:
                parts.append(text[start : match.start()])
            parts.append(self._added[match.group()])
            start = match.end()
        if start < len(text):
            parts.append(text[start:])
        return parts

    def encode(self, text: str, scope: str) -> list[int]:
        parts = self._parts(text)
        missing: dict[str, None] = {}  # each new piece once, however often the text repeats it
        kept = self._kept
        with self._lock:
            for i, part in enumerate(parts):
                if isinstance(part, str):
                    ids = kept.get((scope, part))
                    if ids is None:
                        missing[part] = None
                    else:
                        kept.move_to_end((scope, part))
                        parts[i] = ids
        new: dict[str, array[int]] = {}
        if missing:
            new = self._encode_new(list(missing))
            self._keep(scope, new)
        out: list[int] = []
        for part in parts:
            if isinstance(part, int):
                out.append(part)
            elif isinstance(part, array):
                out += part
            else:
                out += new[part]
        return out

    def _encode_new(self, pieces: list[str]) -> dict[str, array[int]]:
        """The pieces' ids, in one call into the tokenizer: each call has its own fixed cost, and a
        batch of several would be spread over the tokenizer's threads (more CPU in all, spent
        spinning). Joined by an added token, since the tokenizer splits there anyway."""
        text = self._joiner.join(pieces)
        (encoding,) = self._tokenizer.encode_batch_fast([text], add_special_tokens=False)
        new: dict[str, array[int]] = {}
        ids: list[int] = encoding.ids
        start = 0
        for piece in pieces[:-1]:
            end = ids.index(self._joiner_id, start)
            new[piece] = array("i", ids[start:end])
            start = end + 1
        new[pieces[-1]] = array("i", ids[start:])
        return new

    def _keep(self, scope: str, new: dict[str, array[int]]) -> None:
        with self._lock:
            for piece, ids in new.items():
                size = _size(piece, ids)
                if size > self._max_bytes or (scope, piece) in self._kept:
                    continue
                self._kept[scope, piece] = ids
                self._bytes += size
            while self._bytes > self._max_bytes:
                (_, gone), gone_ids = self._kept.popitem(last=False)
                self._bytes -= _size(gone, gone_ids)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0

    @property
    def size(self) -> int:
        """Bytes kept, as the bound counts them."""
        return self._bytes
