"""The KV pool is committed when it is allocated (gpu_container/engine/kv_cache.py): its pages are
resident before the engine serves, so no request pays their first-write faults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_container.engine.engine_process import EngineProcess
from gpu_container.engine.types import EngineConfig

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


def test_a_pool_the_process_cannot_have_is_refused_at_start_naming_num_blocks(demo_dir: Path) -> None:
    """Committed page by page, a pool past the memory the engine may have got it OOM-killed mid-start
    (inside a container's limit, or the machine's RAM), and the edge's start failed with "exited
    during start-up (exit code -9)". 256 TiB here: more than any machine has, and than x86-64's user
    address space, so that even without the check it fails without touching memory."""
    block_bytes = 2 * 2 * 16 * 2 * 32 * 4  # keys and values: 2 layers, 16 tokens, 2 heads of 32 floats
    config = EngineConfig(block_size=16, num_blocks=(1 << 48) // block_bytes)
    engine = EngineProcess(demo_dir, config, "too-big-pool")
    refusal = r"failed to start: .*KV cache needs 262144\.0 GiB.*lower num_blocks"
    with pytest.raises(RuntimeError, match=refusal):
        engine.start()
    assert engine.pid is not None
    assert not engine.running
