"""Incremental detokenization: token ids in, only stable text out.

Byte-level BPE (and byte-fallback SentencePiece) tokens can carry part of a UTF-8 character, and
some decoders render a token differently depending on its neighbours (a SentencePiece word's
leading space). So text is produced by decoding a short window of tokens (the last ones already
emitted, as left context, plus the new ones) and emitting what it adds to the window's emitted
text, except a trailing replacement character: that may be a character whose remaining bytes are
still to come, so it is held until the next token says.

One decode per push: the window's emitted text is the previous push's decode of the same window,
kept. Only when the window has grown past _WINDOW_TOKENS does it move up to the last push's
tokens, which costs one more decode (a short window keeps every decode cheap).
"""

from __future__ import annotations

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
_WINDOW_TOKENS = 4


class IncrementalDetokenizer:
    """Feed token ids as they arrive; `push` returns the new text that can no longer change."""

    __slots__ = (
        "_emitted",
        "_ids",
        "_prefix",
        "_prefix_offset",
        "_read_offset",
        "_skip_special",
        "_tokenizer",
    )

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        # _ids[_prefix_offset:_read_offset] is emitted text kept as left context for the decoder,
        # and _prefix its decoded text; of the text after it, the first _emitted characters are
        # out already.
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix = ""
        self._emitted = 0

    def push(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        return self._advance(False)

    def flush(self) -> str:
        """Whatever is still held: the sequence has ended, nothing will complete it."""
        return self._advance(True)

    def _advance(self, final: bool) -> str:
        ids = self._ids
        full = self._tokenizer.decode(ids[self._prefix_offset :], self._skip_special)
        start = len(self._prefix) + self._emitted
        if final or not full.endswith(REPLACEMENT_CHAR):
            read = self._read_offset
            self._read_offset = len(ids)
            self._emitted = 0
            if len(ids) - self._prefix_offset > _WINDOW_TOKENS:
                self._prefix_offset = read
                self._prefix = self._tokenizer.decode(ids[read:], self._skip_special)
            else:
                self._prefix = full
            return full[start:]
        stable = full.rstrip(REPLACEMENT_CHAR)
        if len(stable) <= start:
            return ""
        self._emitted += len(stable) - start
        return stable[start:]
