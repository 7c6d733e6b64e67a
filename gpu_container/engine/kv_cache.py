"""The K/V pool: allocated once, addressed by (block, offset) slots through the block tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_container.engine.arrays import Floats


@dataclass(frozen=True, slots=True)
class KVCache:
    # Each is [num_layers, num_blocks, block_size, n_kv_heads, head_dim], float32.
    keys: Floats
    values: Floats

    @classmethod
    def allocate(
        cls, num_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int
    ) -> KVCache:
        shape = (num_layers, num_blocks, block_size, n_kv_heads, head_dim)
        return cls(np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=np.float32))

    @property
    def block_size(self) -> int:
        return int(self.keys.shape[2])

    @property
    def num_blocks(self) -> int:
        return int(self.keys.shape[1])
