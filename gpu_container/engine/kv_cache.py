"""The K/V pool: allocated once, addressed by (block, offset) slots through the block tables.

Its memory is committed when it is allocated, every page written once, as a GPU engine's KV pool is
device memory held from the start. Left to the kernel (numpy's zeros are pages mapped on first
write), the first requests a fresh engine served paid the faults of every block they touched, in
both its threads at once: 16 new prompts at once on a just-started engine had their first tokens
after 1.3-2.0 s (p50) through local Triton and 0.9-1.1 s in process, against 0.54-0.62 and
0.57-0.68 s with the pool committed (SmolLM2-135M, `python -m bench.cold_burst`, docs/benchmarks.md;
with new prompts in every burst, the first now costs what later ones do). What it costs: the
configured pool's memory from the start (720 MiB for SmolLM2-135M's 1,024 blocks, resident in
0.28 s) instead of as the blocks are first used, which the engine was sized to hold anyway.
"""

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
        return cls(_committed(shape), _committed(shape))

    @property
    def block_size(self) -> int:
        return int(self.keys.shape[2])

    @property
    def num_blocks(self) -> int:
        return int(self.keys.shape[1])


def _committed(shape: tuple[int, ...]) -> Floats:
    pool = np.empty(shape, dtype=np.float32)
    pool.fill(0.0)  # every page written now: resident, none faulted in while serving
    return pool
