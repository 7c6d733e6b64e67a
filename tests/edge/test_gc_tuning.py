"""edge/gc_tuning.py: what `floodgate serve` does to the collector at start-up."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: freezing and thresholds are process-wide, the test process keeps its own.
PROBE = """
import gc
from edge.gc_tuning import OLD_THRESHOLD, MIDDLE_THRESHOLD, YOUNG_THRESHOLD, quiet_gc
import edge.app  # the imports a serving process holds
quiet_gc()
assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD), gc.get_threshold()
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen  # the start-up heap: never walked by a collection again
cycle = []
cycle.append(cycle)
del cycle
assert gc.collect() >= 1  # cycles made after start-up are still collected
print(frozen)
"""


def test_quiet_gc_freezes_the_start_up_heap_and_still_collects_cycles() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 10_000
