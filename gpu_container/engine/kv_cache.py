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

A pool the process cannot have is refused before it is allocated, naming `num_blocks`: committed
page by page, one past a container's memory limit (or the machine's free memory) had the OOM killer
end the engine mid-start, and the edge's start failed with "exited during start-up (exit code -9)",
nothing saying which setting to lower (as vLLM refuses a KV cache its memory cannot hold).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
        _check_fits(shape)
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


_GIB = 1 << 30
_CGROUP = Path("/sys/fs/cgroup")


def _check_fits(shape: tuple[int, ...]) -> None:
    """MemoryError, naming num_blocks, when the pool (keys and values) is more than this process can
    still have: it would be OOM-killed while committing it."""
    num_layers, num_blocks, block_size, n_kv_heads, head_dim = shape
    block_bytes = 2 * num_layers * block_size * n_kv_heads * head_dim * np.dtype(np.float32).itemsize
    room = memory_room()
    if room is None or num_blocks * block_bytes <= room:
        return
    raise MemoryError(
        f"the KV cache needs {num_blocks * block_bytes / _GIB:.1f} GiB (num_blocks {num_blocks} x "
        f"{block_bytes} bytes a block of {block_size} tokens) but this process can have only "
        f"{room / _GIB:.1f} GiB more memory: lower num_blocks to under {room // block_bytes}"
    )


def memory_room() -> int | None:
    """Bytes this process can still commit (None where nothing says): the machine's available memory
    (/proc/meminfo MemAvailable), within each memory cgroup above it, the container's limit among
    them, less the anonymous memory it holds (its page cache can be reclaimed)."""
    rooms = [r for r in (_meminfo_available(), *_cgroup_rooms()) if r is not None]
    return min(rooms) if rooms else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_rooms() -> list[int]:
    """limit - anonymous usage at the process's memory cgroup and each one above it (v1 or v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    rooms: list[int] = []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            root, limit_file, anon_key = _CGROUP, "memory.max", "anon"
        elif "memory" in controllers.split(","):
            root, limit_file, anon_key = _CGROUP / "memory", "memory.limit_in_bytes", "total_rss"
        else:
            continue
        here = Path(path)
        for level in (here, *here.parents):
            room = _cgroup_room(root / level.relative_to("/"), limit_file, anon_key)
            if room is not None:
                rooms.append(room)
    return rooms


def _cgroup_room(directory: Path, limit_file: str, anon_key: str) -> int | None:
    try:
        limit_text = (directory / limit_file).read_text().strip()
        if limit_text == "max" or int(limit_text) >= 1 << 62:  # v2's "max", v1's page-rounded 2^63
            return None
        stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
        return max(0, int(limit_text) - int(stat[anon_key]))
    except (OSError, ValueError, KeyError):
        return None
