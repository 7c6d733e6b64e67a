"""The prefill budget as a time budget: how many prompt tokens a step may carry so that the streams
already decoding are slowed by at most a set factor.

A fixed token budget cannot do that on a CPU: 512 prompt tokens cost a few milliseconds on the
2-layer demo model and several seconds on SmolLM2-135M, during which every running stream stops.
So the engine measures its step cost when it starts (a short calibration on the real model and a
scratch corner of the KV pool) and models a step as

    seconds = fixed + per_decode * decodes + prefill_overhead + per_prefill_token * prefill_tokens

A step with `decodes` running streams may then carry
    ((slowdown - 1) * (fixed + per_decode * decodes) - prefill_overhead) / per_prefill_token
prompt tokens, but never fewer than a floor (min_chunk) for each prompt waiting for its prefill;
with no stream decoding (an idle engine, or a burst of arrivals all still prefilling) nobody is
waiting on a decode, and the token cap alone applies.

The floor is there for the prompt's sake: on a CPU a decode step of a few streams leaves room for
2-4 prompt tokens, and such chunks cost several times more per token than a chunk of a few dozen
(a few rows run as GEMVs, the whole context is gathered and attended to once per chunk), so a
500-token prompt joining 4 streams waited 40 s for its first token instead of 3. With the floor the
decodes are slowed more than `slowdown` while a prompt joins; docs/bench-engine.md measures the
trade (slowdown x floor against the streams' p99 and the prompt's TTFT) that chose the defaults.
The floor is per prompt: a wave of 15 arrivals next to one decoding stream would otherwise be
admitted one floor a step, each new user waiting behind the others for as many steps.

prefill_overhead is what a prefill chunk costs whatever its size, and it grows with the prompt's
context (each chunk gathers and attends to all of it): each step that carries prefill next to
decodes refines it (an exponential average of what steps took beyond the model). Only that term is
refined: attributing the excess to the per-token cost instead would shrink the chunk, which makes
the fixed part weigh more per token, which shrinks the chunk again, down to one token a step.

Seconds are the engine thread's CPU time when BLAS runs on that thread alone (the default): on a
shared machine the wall clock also counts other processes' turns on the core, which slow decode
and prefill steps alike and would otherwise read as an expensive prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.scheduler import ScheduledChunk
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import SamplingParams

# Weight of the newest observation in the running estimate of the prefill overhead.
_SMOOTHING = 0.3
_CALIBRATION_DECODES = 8
_CALIBRATION_CHUNKS = (16, 64)
_CALIBRATION_CONTEXT = 32

Clock = Callable[[], float]


def step_clock(blas_threads: int) -> Clock:
    """CPU time of the stepping thread when it does all the work, else the wall clock."""
    return time.thread_time if blas_threads == 1 else time.perf_counter


@dataclass(slots=True)
class StepCost:
    fixed_s: float
    per_decode_s: float
    per_prefill_token_s: float
    prefill_overhead_s: float = 0.0

    def decode_step_s(self, decodes: int) -> float:
        return self.fixed_s + self.per_decode_s * decodes


class PrefillBudget:
    """Prompt tokens allowed in a step, given how many sequences decode in it."""

    def __init__(self, cost: StepCost, slowdown: float, max_tokens: int, min_chunk: int = 1) -> None:
        if slowdown <= 1:
            raise ValueError("prefill_slowdown must be above 1")
        if min_chunk < 1:
            raise ValueError("min_prefill_chunk must be at least 1")
        self.cost = cost
        self._slowdown = slowdown
        self._max_tokens = max_tokens
        self._min_chunk = min(min_chunk, max_tokens)

    def tokens(self, decodes: int, prompts: int = 1) -> int:
        """Prompt tokens for a step with `decodes` decoding sequences and `prompts` prompts pending."""
        if decodes == 0:
            return self._max_tokens
        c = self.cost
        slack = (self._slowdown - 1) * c.decode_step_s(decodes) - c.prefill_overhead_s
        floor = self._min_chunk * max(1, prompts)
        return min(self._max_tokens, max(floor, int(slack / c.per_prefill_token_s)))

    def observe(self, decodes: int, prefill_tokens: int, seconds: float) -> None:
        """Refine the prefill overhead from a step that carried prefill alongside decodes."""
        if decodes == 0 or prefill_tokens == 0:
            return
        c = self.cost
        measured = max(0.0, seconds - c.decode_step_s(decodes) - c.per_prefill_token_s * prefill_tokens)
        c.prefill_overhead_s = (1 - _SMOOTHING) * c.prefill_overhead_s + _SMOOTHING * measured


def calibrate(model: LlamaModel, cache: KVCache, clock: Clock, repeats: int = 2) -> StepCost:
    """Time decode steps of 1 and 8 sequences and prefill chunks of two sizes, on scratch blocks.

    Run before the engine serves anything: it writes garbage K/V into blocks nobody owns yet, which
    whoever reserves them later overwrites before reading.
    """
    block_size = cache.block_size
    params = SamplingParams(max_new_tokens=1)

    def scratch(i: int, computed: int, total: int) -> Sequence:
        seq = Sequence(f"calibration-{i}", [1] * total, params, lambda _: None)
        per_seq = -(-max(total, _CALIBRATION_CONTEXT + 1) // block_size)
        seq.block_table = [(i * per_seq + b) % cache.num_blocks for b in range(per_seq)]
        seq.num_computed_tokens = computed
        return seq

    def timed(build: Callable[[], list[ScheduledChunk]]) -> float:
        batch = ForwardBatch.from_chunks(build(), block_size)
        model.forward(batch, cache)  # warm-up: first-touch page faults, BLAS buffers
        times = []
        for _ in range(repeats):
            start = clock()
            model.forward(batch, cache)
            times.append(clock() - start)
        return float(np.median(times))

    ctx = _CALIBRATION_CONTEXT
    one = timed(lambda: [ScheduledChunk(scratch(0, ctx, ctx + 1), 1)])
    many = timed(lambda: [ScheduledChunk(scratch(i, ctx, ctx + 1), 1) for i in range(_CALIBRATION_DECODES)])
    small, large = _CALIBRATION_CHUNKS
    t_small = timed(lambda: [ScheduledChunk(scratch(0, 0, small), small)])
    t_large = timed(lambda: [ScheduledChunk(scratch(0, 0, large), large)])
    decodes = _CALIBRATION_DECODES
    mixed = timed(
        lambda: (
            [ScheduledChunk(scratch(i, ctx, ctx + 1), 1) for i in range(decodes)]
            + [ScheduledChunk(scratch(decodes, 0, small), small)]
        )
    )
    per_decode = max(0.0, (many - one) / (decodes - 1))
    per_prefill = max((t_large - t_small) / (large - small), t_large / large / 4, 1e-6)
    fixed = max(one - per_decode, 1e-6)
    # What joining decodes costs beyond the chunk's tokens: a few decode rows run as GEMVs, a
    # batch with a chunk in it as one GEMM, which costs more per row at these sizes.
    overhead = max(0.0, mixed - many - per_prefill * small)
    return StepCost(fixed, per_decode, per_prefill, overhead)
