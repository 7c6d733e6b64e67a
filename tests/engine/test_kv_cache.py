"""The KV pool is committed when it is allocated (gpu_container/engine/kv_cache.py): its pages are
resident before the engine serves, so no request pays their first-write faults."""

from __future__ import annotations

import os

from gpu_container.engine.kv_cache import KVCache


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_pool_is_resident_and_zero_once_allocated() -> None:
    before = _resident_bytes()
    cache = KVCache.allocate(num_layers=4, num_blocks=256, block_size=16, n_kv_heads=4, head_dim=64)
    grown = _resident_bytes() - before

    pool_bytes = cache.keys.nbytes + cache.values.nbytes  # 32 MiB
    # Mapped on first write instead, it would have grown by next to nothing here.
    assert grown >= 0.9 * pool_bytes, (grown, pool_bytes)
    assert not cache.keys.any() and not cache.values.any()
