"""Garbage collection for a process that holds thousands of open streams.

Every open stream keeps its task, coroutines, dicts and buffers alive for its whole life, so they
all reach CPython's oldest generation. A full collection walks every tracked object and runs each
time the survivors since the last one reach a quarter of the old generation: with thousands of
streams that is a pause of most of a second, freeing nothing, every few seconds, and every stream
stalls meanwhile (issue 11: 0.6–1.1 s pauses above ~3,500 streams, a quarter to a third of the CPU).

So, once at start-up (`quiet_gc`):

* `gc.freeze()` moves everything alive after imports and app construction (modules, classes,
  settings, the app's routes) to the permanent generation, which no collection walks again;
* the young generation is collected every 50,000 allocations instead of 700, so per-token garbage
  that dies young is freed in fewer, cheaper passes and fewer short-lived objects get promoted;
* a full collection is considered only after 100 middle-generation ones (instead of 10).

Reference cycles are still collected (every generation still runs), just less often: the price is
the memory cycles hold in between, measured in docs/bench-streams.md.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
MIDDLE_THRESHOLD = 10
OLD_THRESHOLD = 100


def quiet_gc() -> None:
    """Freeze the start-up heap and space collections out; call once, after the app is built."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
