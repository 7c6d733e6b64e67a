"""The prefill lane: a step's prefill chunks computed on a second thread while its decodes run on the
engine's own, each a forward of its own, and the step ends when both have.

Why: on a CPU a decode step is a few rows against every weight (bound by memory) and a prefill chunk
many rows (bound by arithmetic), and with one BLAS thread the engine leaves the machine's second core
to the event loop, which on a real model needs 1-2 % of it. In one forward the chunk's rows lengthen
every decode's step by their whole cost; on a core of their own they cost the decodes only what the
two share (memory bandwidth, the GIL between numpy calls). Measured on the AMD EPYC (SmolLM2-135M,
4 decodes at 300-600 keys, one BLAS thread): a 16-token chunk at 500 tokens of context took 107 ms in
one forward with the decodes (which alone take 54 ms); on two threads the decodes took 59 ms and the
chunk 88 ms, so the step 88. The time budget (step_budget.py) then prices the chunk alone against
the decode step, and a step of the same length carries 3-5x the prompt tokens.

The two forwards share no state but the weights (read only) and the KV pool, where each writes only
its own sequences' slots; the scheduler's bookkeeping stays on the engine thread. numpy releases the
GIL inside its BLAS calls and array loops, so both threads run at once between them.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal

from gpu_container.engine.arrays import Floats
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel

LaneSetting = Literal["auto", "on", "off"]


def lane_wanted(setting: LaneSetting, blas_threads: int) -> bool:
    """ "auto": a lane when BLAS keeps to one thread and the process may run on two CPUs or more
    (on one CPU the two forwards would take turns, and the budget would price a chunk as free)."""
    if setting != "auto":
        return setting == "on"
    return blas_threads == 1 and _usable_cpus() >= 2


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class PrefillLane:
    """One worker thread that runs a forward for the engine thread and times it."""

    def __init__(self, model: LlamaModel, cache: KVCache) -> None:
        self._model = model
        self._cache = cache
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-prefill-lane")

    def submit(self, batch: ForwardBatch) -> Future[tuple[Floats, float]]:
        """Start the batch's forward; the future holds its logits and the seconds it took, or the
        exception it raised. Wall seconds, not the thread's CPU time: the step ends when the lane
        does, and what the lane waits for (the GIL between its numpy calls, the other thread's)
        delays that as much as what it computes; measured, 3-8 ms a step beyond its CPU time."""
        return self._pool.submit(self._forward, batch)

    def _forward(self, batch: ForwardBatch) -> tuple[Floats, float]:
        start = time.perf_counter()
        logits = self._model.forward(batch, self._cache)
        return logits, time.perf_counter() - start

    def close(self) -> None:
        self._pool.shutdown(wait=True)
