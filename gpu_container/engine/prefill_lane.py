"""The prefill lane: prompts' prefill chunks computed on a second thread while the engine thread
goes on decoding without waiting for them; it commits them at its first step after they are done.

Why: on a CPU a decode step is a few rows against every weight (bound by memory) and a prefill chunk
many rows (bound by arithmetic), and with one BLAS thread the engine leaves the machine's second core
to the event loop, which on a real model needs 1-2 % of it. In one forward with the decodes a chunk
lengthens every decode's step by its whole cost, so a time budget had to cut prompts into a few
tokens a step (GEMV rows, the dearest kind: a 2,000-token prompt beside 4 streams took 60-70 s to
its first token on the AMD EPYC). On a core of its own a chunk costs the decodes only what the two
threads share (memory bandwidth, the GIL between numpy calls), and it can be large, where a token
costs least. Measured there (SmolLM2-135M, 4 decodes at 300-600 keys, one BLAS thread): a 16-token
chunk at 500 tokens of context took 107 ms in one forward with the decodes, which alone take 54 ms;
on two threads the decodes took 59 ms and the chunk 88.

The two forwards share no state but the weights (read only) and the KV pool, where each writes only
its own sequences' slots: the scheduler holds the lane's sequences (no step schedules them, no
preemption takes their blocks) and the engine defers their aborts until the lane is done. numpy
releases the GIL inside its BLAS calls and array loops, so both threads run at once between them.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from gpu_container.engine.arrays import Floats
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.scheduler import ScheduledChunk
from gpu_container.engine.types import LaneSetting


def lane_wanted(setting: LaneSetting, blas_threads: int) -> bool:
    """ "auto": a lane when BLAS keeps to one thread and the process may run on two CPUs or more
    (on one CPU the two forwards would take turns: every decode step would wait out the chunk's
    share of the core, with no time budget to keep the chunk small)."""
    if setting != "auto":
        return setting == "on"
    return blas_threads == 1 and _usable_cpus() >= 2


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class LaneWork(NamedTuple):
    """The prefill chunks the lane is computing, and their forward's logits to come."""

    future: Future[Floats]
    chunks: list[ScheduledChunk]


class PrefillLane:
    """One worker thread that runs a forward for the engine thread."""

    def __init__(self, model: LlamaModel, cache: KVCache) -> None:
        self._model = model
        self._cache = cache
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-prefill-lane")

    def submit(self, batch: ForwardBatch) -> Future[Floats]:
        """Start the batch's forward; the future holds its logits, or the exception it raised."""
        return self._pool.submit(self._model.forward, batch, self._cache)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
