"""Which prompt prefixes a replica probably still has in its KV cache, as far as this edge can tell.

The edge cannot see inside a replica's cache, but it knows every prompt it sent there. Each prompt
is cut into fixed blocks of ROUTING_BLOCK_TOKENS tokens, each named by a hash chained over every
token before it (as the engines name their cached blocks), and the replica's index remembers the
most recent ones. It is bounded by what the replica's KV cache can hold, and forgets least recently
sent first, tail blocks before head blocks: the replicas' own caches evict in that order (vLLM, our
engine, TensorRT-LLM), so the index ages out roughly as the replica does. A guess, never trusted
for correctness: a wrong one only costs a cache miss, which is why a fast non-cryptographic hash
is enough here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

# The index's granularity, independent of any replica's block size: it only estimates overlap.
ROUTING_BLOCK_TOKENS = 16
# Prompt blocks looked at (4,096 tokens): beyond it a prompt's prefix decides nothing more.
MAX_ROUTING_BLOCKS = 256


def routing_hashes(prompt_ids: Sequence[int], cache_salt: str = "") -> tuple[int, ...]:
    """Keys of the prompt's full leading blocks, first block first, each chained over all before it.

    The chain starts from the request's cache salt, as in the replicas: a replica holds a prefix
    only for requests of the same salt, so the same prompt under another salt names other blocks."""
    count = min(len(prompt_ids) // ROUTING_BLOCK_TOKENS, MAX_ROUTING_BLOCKS)
    keys: list[int] = []
    parent = int.from_bytes(hashlib.blake2b(cache_salt.encode(), digest_size=8).digest()) if cache_salt else 0
    for i in range(count):
        parent = hash((parent, *prompt_ids[i * ROUTING_BLOCK_TOKENS : (i + 1) * ROUTING_BLOCK_TOKENS]))
        keys.append(parent)
    return tuple(keys)


class PrefixIndex:
    def __init__(self, max_blocks: int = 1 << 16) -> None:
        self.max_blocks = max(1, max_blocks)
        # Least recently sent first.
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def clear(self) -> None:
        self._keys.clear()

    def resize(self, max_blocks: int) -> None:
        """Follow the replica's KV capacity (in routing blocks); forgets the oldest if it shrank."""
        self.max_blocks = max(1, max_blocks)
        self._trim()

    def record(self, keys: Sequence[int]) -> None:
        """A prompt with these block keys was sent to the replica: its blocks are the freshest now.

        Recorded last block first, so the head of a prompt (a system prompt, an earlier turn) is the
        most recent and outlives its tail, as in the replicas' own caches."""
        for key in reversed(keys):
            self._keys[key] = None
            self._keys.move_to_end(key)
        self._trim()

    def overlap(self, keys: Sequence[int]) -> int:
        """How many of the prompt's leading blocks the replica probably holds."""
        count = 0
        for key in keys:
            if key not in self._keys:
                break
            count += 1
        return count

    def _trim(self) -> None:
        while len(self._keys) > self.max_blocks:
            self._keys.popitem(last=False)
