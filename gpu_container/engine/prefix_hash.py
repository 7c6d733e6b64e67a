"""The hash chain that names a full KV block by every token up to its end.

A block's K/V depend on all tokens before it, not only its own, so its key chains the previous
block's key with its own tokens: two sequences share a block's key exactly when they share the whole
prefix up to that block's end. The engine's prefix cache keys its blocks this way; the edge's router
computes the same keys from a prompt to guess which replica holds them.

blake2b rather than Python's hash(): stable across processes and versions, and hard to collide on
purpose (the engine checks the tokens on every hit anyway; the router cannot, and a forged collision
would only cost it a miss).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

# The parent of a sequence's first block.
ROOT_HASH = 0


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """The key of a full block holding tokens, whose preceding block's key is parent."""
    h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


def block_hashes(tokens: Sequence[int], block_size: int, limit: int | None = None) -> list[int]:
    """Keys of the full blocks of tokens, first block first; at most limit of them."""
    count = len(tokens) // block_size
    if limit is not None:
        count = min(count, limit)
    hashes: list[int] = []
    parent = ROOT_HASH
    for i in range(count):
        parent = chain_hash(parent, tokens[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes
