"""Each token's bytes, for tokenizers whose decoder is byte-level BPE alone.

GPT-2's byte-level BPE (SmolLM2, Llama 3, Qwen, Mistral's Tekken...) spells every byte as one
printable character, so a token's bytes never depend on its neighbours: the text of a sequence is
the UTF-8 decoding of its tokens' bytes put end to end. With that table, the relay's detokenizer is
a list lookup and an incremental UTF-8 decode per delta instead of a call into the tokenizer per
delta (edge/text/detokenizer.py): per token on the hot path of every stream.

The table is built from the tokenizer's own vocabulary and then checked against the tokenizer's own
decode of every token: any difference (a decoder chain with more than the byte-level step, a token
this reading gets wrong) and there is no table, and the detokenizer asks the tokenizer as before.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders


def _byte_of_char() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, reversed: the printable byte values stand for themselves, the
    others for the code points from 256 up, in order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def byte_pieces(tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> list[bytes] | None:
    """The bytes of every token id (empty for a special token that decoding skips), or None when
    this tokenizer's decoding is not byte-level BPE alone."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    byte_of = _byte_of_char()
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    special = {
        token_id
        for token_id, added in tokenizer.get_added_tokens_decoder().items()
        if added.special and skip_special_tokens
    }
    pieces: list[bytes] = []
    for token_id in range(size):
        token = tokenizer.id_to_token(token_id)
        if token is None or token_id in special:
            pieces.append(b"")
        elif all(c in byte_of for c in token):
            pieces.append(bytes(byte_of[c] for c in token))
        else:
            # A character the byte-level alphabet lacks (an added token's own text): as written.
            pieces.append(token.encode())
    expected = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=skip_special_tokens)
    # Also a token holding part of a character: its replacement characters must be the decoder's.
    if any(piece.decode(errors="replace") != text for piece, text in zip(pieces, expected, strict=True)):
        return None
    return pieces
