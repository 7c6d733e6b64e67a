"""Incremental detokenization: token ids in, only stable text out.

Byte-level BPE (and byte-fallback SentencePiece) tokens can carry part of a UTF-8 character, and
some decoders change how a token renders depending on its neighbours (a SentencePiece word's
leading space). So text is produced by decoding a short window twice, with and without the new
tokens, and emitting the difference, holding it back while it ends in an incomplete character.
"""

from __future__ import annotations

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# A UTF-8 character is at most 4 bytes and every token carries at least one: past this many held
# tokens a trailing replacement character is real invalid output, not a character still arriving.
_MAX_HELD_TOKENS = 4


class IncrementalDetokenizer:
    """Feed token ids as they arrive; `push` returns the new text that can no longer change."""

    __slots__ = ("_ids", "_prefix_offset", "_read_offset", "_skip_special", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        # _ids[_prefix_offset:_read_offset] was already emitted and serves as left context.
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset], self._skip_special)
        full = decode(self._ids[self._prefix_offset :], self._skip_special)
        held = len(self._ids) - self._read_offset
        if len(full) <= len(prefix) or (full.endswith(REPLACEMENT_CHAR) and held < _MAX_HELD_TOKENS):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix) :]

    def flush(self) -> str:
        """The held-back tail, whatever it is: the sequence has ended."""
        if self._read_offset == len(self._ids):
            return ""
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset], self._skip_special)
        full = decode(self._ids[self._prefix_offset :], self._skip_special)
        self._prefix_offset = self._read_offset = len(self._ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
