"""Incremental detokenization: token ids in, only stable text out.

Byte-level BPE (and byte-fallback SentencePiece) tokens can carry part of a UTF-8 character, and
some decoders render a token differently depending on its neighbours (a SentencePiece word's
leading space). So text is produced by decoding a short window of tokens (the last ones already
emitted, as left context, plus the new ones) and emitting what it adds to the window's emitted
text, except a trailing replacement character: that may be a character whose remaining bytes are
still to come, so it is held until the next token says.

One decode per push: the window's emitted text is the previous push's decode of the same window,
kept. Only when the window has grown past _WINDOW_TOKENS does it move up to the last push's
tokens (from the first one not skipped as special), which costs one more decode (a short window
keeps every decode cheap).

Where a token's bytes never depend on its neighbours (byte-level BPE, edge/text/byte_pieces.py),
`PiecesDetokenizer` needs no window and no call into the tokenizer: each push joins its tokens'
bytes and an incremental UTF-8 decoder holds back a character whose bytes are still to come.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Protocol

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
_WINDOW_TOKENS = 4


class Detokenizer(Protocol):
    def push(self, token_ids: list[int]) -> str:
        """The new text of these tokens that can no longer change."""
        ...

    def flush(self) -> str:
        """The sequence has ended: whatever is held and whole. A character whose bytes were cut off
        (max_tokens, a stop token, the budget) is dropped, as vLLM drops it: a U+FFFD at the
        reply's end is no text the model meant, and a client sending the reply back as the next
        turn's history would teach the model to write one."""
        ...


_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


class PieceTable:
    """A byte-level tokenizer's pieces (edge/text/byte_pieces.py), built once per model, and the
    text of each piece that is whole UTF-8 by itself (None where it is not: part of a character)."""

    __slots__ = ("pieces", "texts")

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.texts: list[str | None] = [_whole_text(piece) for piece in pieces]


def _whole_text(piece: bytes) -> str | None:
    try:
        return piece.decode()
    except UnicodeDecodeError:
        return None


class PiecesDetokenizer:
    """Feed token ids as they arrive; each id's bytes come from the model's PieceTable.

    Most tokens are whole characters: when the decoder holds nothing back, such a token's text is
    the table's, read without a decode (the incremental decoder's `decode` is a Python frame, a
    bytes join and a slice, per token of every stream: docs/bench-streams.md, eleventh pass)."""

    __slots__ = ("_decode", "_decoder", "_pieces", "_size", "_texts")

    def __init__(self, table: PieceTable) -> None:
        self._pieces = table.pieces
        self._texts = table.texts
        self._size = len(table.pieces)
        # Invalid bytes read as the tokenizer's own decode reads them (byte_pieces checks it).
        self._decoder = _Utf8Decoder("replace")
        self._decode = self._decoder.decode

    def push(self, token_ids: list[int]) -> str:
        pieces, size = self._pieces, self._size
        if len(token_ids) == 1 and 0 <= (token_id := token_ids[0]) < size:
            if not self._decoder.buffer and (text := self._texts[token_id]) is not None:
                return text
            text = self._decode(pieces[token_id])
        else:
            # An id past the vocabulary decodes to nothing, as the tokenizer skips it.
            text = self._decode(b"".join([pieces[i] for i in token_ids if 0 <= i < size]))
        buffer = self._decoder.buffer
        if len(buffer) > 1 and buffer[0] == 0xED and buffer[1] >= 0xA0:
            # A surrogate's encoding (ED A0-BF), which no more bytes can make valid: CPython's
            # decoder waits on it all the same (surrogatepass could read it), so it came out one
            # token late, and a reply ending there lost the two U+FFFD the tokenizer's decode shows.
            text += self._decode(b"", True)
        return text

    def flush(self) -> str:
        # The decoder holds only the start of a character that may yet be valid (it replaces
        # invalid bytes as they come): all there is at the end is a cut-off character.
        self._decoder.reset()
        return ""


class IncrementalDetokenizer:
    """Feed token ids as they arrive; `push` returns the new text that can no longer change."""

    __slots__ = (
        "_emitted",
        "_ids",
        "_prefix",
        "_prefix_offset",
        "_read_offset",
        "_skip_special",
        "_skipped",
        "_tokenizer",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        special_ids: frozenset[int] | None = None,
        context: Sequence[int] = (),
    ) -> None:
        """`special_ids`: the tokenizer's special tokens (`special_token_ids`), given where one set
        serves every stream of a model. `context`: the text the reply goes on from (the prompt of a
        continued message), whose last tokens start the window: a SentencePiece decoder strips the
        first token's leading space, so the reply's first word, decoded alone, lost the space that
        parts it from the message it continues ('The answer is' + '42'); vLLM starts its window
        the same way."""
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        if not skip_special_tokens:
            self._skipped: frozenset[int] = frozenset()
        else:
            self._skipped = special_token_ids(tokenizer) if special_ids is None else special_ids
        self._ids: list[int] = []
        # _ids[_prefix_offset:_read_offset] is emitted text kept as left context for the decoder,
        # and _prefix its decoded text; of the text after it, the first _emitted characters are
        # out already.
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix = ""
        self._emitted = 0
        # From the last skipped token on at most, as the window moves (`_advance`).
        start = max(0, len(context) - _WINDOW_TOKENS)
        for at in range(len(context) - 1, start - 1, -1):
            if context[at] in self._skipped:
                start = at + 1
                break
        if start < len(context):
            self._ids = list(context[start:])
            self._read_offset = len(self._ids)
            self._prefix = tokenizer.decode(self._ids, skip_special_tokens)

    def push(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        return self._advance(False)

    def flush(self) -> str:
        # The decoded text's trailing U+FFFD may be a character cut off, or bytes the model got
        # wrong: a window cannot tell them apart, and either at the very end is dropped.
        return self._advance(True).rstrip(REPLACEMENT_CHAR)

    def _advance(self, final: bool) -> str:
        ids = self._ids
        full = self._tokenizer.decode(ids[self._prefix_offset :], self._skip_special)
        start = len(self._prefix) + self._emitted
        if final or not full.endswith(REPLACEMENT_CHAR):
            read = self._read_offset
            self._read_offset = len(ids)
            self._emitted = 0
            # The window may start only at a token whose text is decoded: a decoder that strips the
            # first token's leading space (SentencePiece's Strip) would otherwise strip it from the
            # token after a skipped special one, which the whole text keeps ('Hello world', not
            # 'Helloworld'). The skipped tokens before it decode to nothing, so none is lost.
            skipped = self._skipped
            while read < len(ids) and ids[read] in skipped:
                read += 1
            if len(ids) - self._prefix_offset > _WINDOW_TOKENS and read < len(ids):
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


def special_token_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids `decode(..., skip_special_tokens=True)` leaves out: added tokens marked special."""
    return frozenset(i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special)


class LeavingOut:
    """A detokenizer that leaves these tokens' text out: a client's stop_token_ids end the reply,
    and the token that ended it is not part of its text (vLLM's default, which leaves out the
    token that stopped a reply unless asked for it); it is counted as generated all the same.

    Any place in a push, not only the last: a replica may send the stop token in one response and
    the end of the stream in the next, so the edge cannot always tell the reply's last token by
    its delta. A stop token ends the reply wherever it comes, so it is the last token anyway."""

    __slots__ = ("_detok", "_left_out")

    def __init__(self, detok: Detokenizer, left_out: frozenset[int]) -> None:
        self._detok = detok
        self._left_out = left_out

    def push(self, token_ids: list[int]) -> str:
        left_out = self._left_out
        return self._detok.push([token for token in token_ids if token not in left_out])

    def flush(self) -> str:
        return self._detok.flush()
