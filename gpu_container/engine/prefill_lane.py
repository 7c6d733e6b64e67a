"""The prefill lane: prompts' prefill chunks computed on a second thread while the engine thread
goes on decoding without waiting for them (or, with nothing to decode, waits for the lane and for
arrivals at once); it commits them at its first step after they are done, as far as they got: the
lane ends its work early when a prompt outranks its own (PrefillLane).

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
preemption takes their blocks) and the engine defers their aborts until the lane is done (asking
it to end at its next piece). numpy
releases the GIL inside its BLAS calls and array loops, so both threads run at once between them.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gpu_container.engine.arrays import Floats
from gpu_container.engine.blas_threads import usable_cpus
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
    return blas_threads == 1 and usable_cpus() >= 2


class LaneResult(NamedTuple):
    """The rows of the work's batch the lane computed (the first `rows`, chunk after chunk), and
    the logits of the chunks among them that were computed whole and complete their sequence."""

    logits: Floats
    rows: int


@dataclass(slots=True)
class LaneWork:
    """The prefill chunks the lane is computing, their result to come, and the flag that ends the
    work at the next piece (see PrefillLane)."""

    future: Future[LaneResult]
    chunks: list[ScheduledChunk]
    stop: threading.Event = field(default_factory=threading.Event)

    def computed(self, rows: int) -> list[ScheduledChunk]:
        """The chunks cut to the first `rows` rows, those not reached left out: what to commit."""
        cut: list[ScheduledChunk] = []
        for chunk in self.chunks:
            n = min(chunk.num_tokens, rows)
            if n <= 0:
                break
            cut.append(chunk if n == chunk.num_tokens else ScheduledChunk(chunk.seq, n))
            rows -= n
        return cut


class PrefillLane:
    """One worker thread that runs prefill chunks for the engine thread, as forwards of at most
    `piece_tokens` rows in sequence, so that its work can end early.

    Why pieces: the scheduler holds the lane's sequences, so a paid prompt arriving while a free
    prompt's chunk of max_num_batched_tokens (512) was on the lane waited for all of it: 10.6 s to
    its first token on a busy 2-CPU machine with SmolLM2-135M, 5.9 s beside 3 decoding streams in a
    quieter run. Between two pieces the lane ends its work if the engine set the work's `stop` (a
    waiting prompt outranks the lane's, an abort of one of them); the engine commits the rows it
    computed and schedules again. There 512 rows as two pieces of 256 cost 2-5 % less CPU than one
    forward (128-row pieces cost 1-8 % more), and the lane goes from piece to piece without waiting
    for the engine thread, which chunks cut to fewer tokens would add at each one.

    Work that mixes priorities (a paid prompt admitted ahead of a free one's next chunk) ends with
    the best priority's last chunk: their first tokens do not wait for the others' rows, which the
    next work carries."""

    def __init__(self, model: LlamaModel, cache: KVCache, block_size: int, piece_tokens: int) -> None:
        self._model = model
        self._cache = cache
        self._block_size = block_size
        self._piece_tokens = piece_tokens
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-prefill-lane")

    def submit(self, chunks: list[ScheduledChunk]) -> LaneWork:
        """Start computing the chunks; the work's future holds its result, or what it raised."""
        stop = threading.Event()
        batch = ForwardBatch.from_chunks(chunks, self._block_size)
        future = self._pool.submit(self._compute, batch, _best_rows(chunks), stop)
        return LaneWork(future, chunks, stop)

    def _compute(self, batch: ForwardBatch, rows: int, stop: threading.Event) -> LaneResult:
        logits: list[Floats] = []
        done = 0
        while done < rows and not (done and stop.is_set()):  # a first piece always: progress
            end = min(done + self._piece_tokens, rows)
            logits.append(self._model.forward(batch.rows(done, end, self._block_size), self._cache))
            done = end
        return LaneResult(np.concatenate(logits), done)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _best_rows(chunks: list[ScheduledChunk]) -> int:
    """Rows up to the end of the last chunk of the best priority among the chunks."""
    best = max(c.seq.priority for c in chunks)
    rows = end = 0
    for chunk in chunks:
        rows += chunk.num_tokens
        if chunk.seq.priority == best:
            end = rows
    return end
