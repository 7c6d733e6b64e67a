"""The KV pool is committed when it is allocated (gpu_container/engine/kv_cache.py): its pages are
resident before the engine serves, so no request pays their first-write faults."""

from __future__ import annotations

import json
import subprocess
import sys

# In an interpreter of its own: in the test process, memory earlier tests freed may back the pool
# already, resident whatever the allocation does.
_WRITE_EVERY_PAGE = """
import json, mmap, resource
from gpu_container.engine.kv_cache import KVCache
cache = KVCache.allocate(num_layers=4, num_blocks=256, block_size=16, n_kv_heads=4, head_dim=64)
zero = not cache.keys.any() and not cache.values.any()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
cache.keys.fill(1.0)
cache.values.fill(1.0)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
pages = (cache.keys.nbytes + cache.values.nbytes) // mmap.PAGESIZE
print(json.dumps({"zero": zero, "faults": faults, "pages": pages}))
"""


def test_writing_the_whole_pool_after_allocation_faults_no_page_in() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_EVERY_PAGE], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(done.stdout)
    assert seen["zero"]
    # Mapped on first write instead, every one of its 8,192 pages would fault here.
    assert seen["faults"] < 0.02 * seen["pages"], seen
