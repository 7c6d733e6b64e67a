"""The hash chain that names a full KV block by every token up to its end.

A block's K/V depend on all tokens before it, not only its own, so its key chains the previous
block's key with its own tokens: two sequences share a block's key exactly when they share the whole
prefix up to that block's end. The engine's prefix cache keys its blocks this way (the edge's router
names prompt blocks alike to guess which replica holds them, with a cheaper hash of its own:
edge/admission/prefix_index.py).

blake2b rather than Python's hash(): stable across processes and versions, and hard to collide on
purpose. 128 bits wide, because a hit is checked only by its own tokens and its parent's key: two
prefixes whose keys collide would let a block computed after one be served after the other (the
wrong K/V, a wrong reply), and at 64 bits a fleet keying billions of blocks is within a birthday
bound's reach (vLLM offers sha256 block keys for the same reason). At 128 bits, no.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

# The parent of an unsalted sequence's first block.
ROOT_HASH = 0
KEY_BYTES = 16


def root_hash(salt: str) -> int:
    """The parent of the first block of a sequence with this cache salt.

    Seeding the chain with the salt is what keeps tenants apart: every key of a salted sequence
    differs from those of any other salt, so requests with different salts never share a block, and
    a user cannot learn from a cache hit what another user sent (vLLM's cache_salt). "" is ROOT_HASH:
    unsalted requests share with each other."""
    if not salt:
        return ROOT_HASH
    digest = hashlib.blake2b(salt.encode(), digest_size=KEY_BYTES, person=b"cache-salt").digest()
    return int.from_bytes(digest, "little")


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """The key of a full block holding tokens, whose preceding block's key is parent."""
    h = hashlib.blake2b(parent.to_bytes(KEY_BYTES, "little"), digest_size=KEY_BYTES)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


def block_hashes(
    tokens: Sequence[int], block_size: int, limit: int | None = None, root: int = ROOT_HASH
) -> list[int]:
    """Keys of the full blocks of tokens, first block first; at most limit of them; the chain
    starts at root (root_hash of the request's cache salt)."""
    count = len(tokens) // block_size
    if limit is not None:
        count = min(count, limit)
    hashes: list[int] = []
    parent = root
    for i in range(count):
        parent = chain_hash(parent, tokens[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes
