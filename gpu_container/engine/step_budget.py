"""The prefill budget as a time budget: how many prompt tokens a step may carry so that the streams
already decoding are slowed by at most a set factor.

A fixed token budget cannot do that on a CPU: 512 prompt tokens cost a few milliseconds on the
2-layer demo model and several seconds on SmolLM2-135M, during which every running stream stops.
So the engine measures its step cost when it starts (a short calibration on the real model and a
scratch corner of the KV pool) and models a step of `d` decodes and prefill chunks of `n` tokens as

    seconds = fixed + per_decode * d + rows(d + sum n) + prefill_overhead * chunks

rows(r) is what the projections cost for r rows of the batch, and it bends at the model's knee
(model.py, measured at start by gemv_knee.py): up to knee_rows rows each row is its own GEMV
(per_row each, the weights re-read from the cache), beyond them the batch is one GEMM (per_row_gemm
each). Where the knee is high (16 rows on an AMD EPYC, a GEMM row a third of a GEMV row) a prompt
token next to a few decodes costs per_row, not the GEMM's per-token cost a large chunk shows: the
budget used to take the latter, put 3x the tokens in a step that it had time for, and the decodes
paid for it. Where it is low (2-3 rows on an Intel Xeon) nearly every step is one GEMM; at a knee
of 1 the two slopes are one, and the line's fixed part holds the GEMM's (calibrate). per_decode is
what a decode costs beyond its row (its logits row, its attention).

A step with `d` running streams may carry the most tokens whose cost stays within (slowdown - 1)
times the decode-only step, found by bisection; with no stream decoding (an idle engine, or a burst
of arrivals all still prefilling) nobody is waiting on a decode, and the token cap alone applies.

prefill_overhead is what a prefill chunk costs beyond its rows, and it grows with the prompt's
context: each chunk reads its whole context from the paged pool and scores every query against it
(a 32-token chunk's step grew from 200 to 330 ms over a 2,000-token prompt, docs/bench-engine.md,
when that read was a gather; it is now a view of the pool where the blocks are consecutive,
attention.py, about a quarter less).
Each step that carries prefill next to decodes refines it (an exponential average of what steps
took beyond the rows), so the chunk shrinks as the context grows; a prompt advances a few dozen
tokens between two observations, which the average follows within a step or two. Only that term
is refined: attributing the excess to the per-token cost instead would shrink the chunk, which
makes the fixed part weigh more per token, which shrinks the chunk again, down to one token a step.

min_chunk is a floor per prompt waiting for its prefill: each gets at least that many tokens a
step, whatever the time budget says. Without it a wave of 15 arrivals next to one decoding stream
is admitted a few tokens a step, each new user waiting behind the others; and a long prompt joining
a few streams late in its prefill, where a chunk's attention over 2,000 tokens of context costs
about 38 ms whatever its size, gets one or two tokens a step: its first token came after 5-10
minutes under load against 11-32 s with no budget (docs/bench-engine.md). The floor trades the
other way: those steps slow the decoding streams more than `slowdown`. `min_prefill_chunk = 1`
gives the time budget alone, for a deployment that puts inter-token latency first. The default
floor is 16 tokens, not 32: next to 4 decodes a 32-token chunk made the step 2.5-3x a decode step,
a 16-token one far less, and the prompt's first token came about as soon (docs/bench-engine.md,
section 4, measures both).

Calibration is a few steps on a machine that may be busy; the decode-only steps the engine runs
anyway refine `fixed` the same way (a slower average: they come every step), so the slowdown is
measured against the decode step as it is now, not as it was at start-up.

Seconds are the engine thread's CPU time when BLAS runs on that thread alone (the default): on a
shared machine the wall clock also counts other processes' turns on the core, which slow decode
and prefill steps alike and would otherwise read as an expensive prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import MAX_KNEE_ROWS, LlamaModel
from gpu_container.engine.scheduler import ScheduledChunk
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import SamplingParams

# Weight of the newest observation in the running estimates of the prefill overhead and of the
# decode step's fixed cost (decode-only steps come often, and one busy moment should not move it).
_SMOOTHING = 0.3
_DECODE_SMOOTHING = 0.1
_CALIBRATION_DECODES = 8
_CALIBRATION_CONTEXT = 32
# The narrower of the two chunks that measure the GEMM's slope when there are no GEMV rows (knee 1).
_GEMM_CHUNK = 16

Clock = Callable[[], float]


def step_clock(blas_threads: int) -> Clock:
    """CPU time of the stepping thread when it does all the work, else the wall clock."""
    return time.thread_time if blas_threads == 1 else time.perf_counter


@dataclass(slots=True)
class StepCost:
    fixed_s: float
    per_row_s: float  # a batch row up to knee_rows (one GEMV per row)
    per_row_gemm_s: float = 0.0  # a row beyond them (the batch as one GEMM)
    per_decode_s: float = 0.0  # what a decode costs beyond its row: its logits row, its attention
    prefill_overhead_s: float = 0.0
    knee_rows: int = MAX_KNEE_ROWS

    def rows_s(self, rows: int) -> float:
        below = min(rows, self.knee_rows)
        return self.per_row_s * below + self.per_row_gemm_s * max(0, rows - self.knee_rows)

    def decode_step_s(self, decodes: int) -> float:
        return self.fixed_s + self.per_decode_s * decodes + self.rows_s(decodes)

    def prefill_s(self, decodes: int, chunks: Iterable[int]) -> float:
        """What prefill chunks of these sizes add to a step of `decodes` decodes."""
        sizes = list(chunks)
        grown = self.rows_s(decodes + sum(sizes)) - self.rows_s(decodes)
        return grown + self.prefill_overhead_s * len(sizes)


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
        slack = (self._slowdown - 1) * self.cost.decode_step_s(decodes) * (1 + 1e-9)  # float rounding
        fits, over = 0, self._max_tokens + 1  # the most tokens within the slack, by bisection
        while over - fits > 1:
            mid = (fits + over) // 2
            if self.cost.prefill_s(decodes, [mid]) <= slack:
                fits = mid
            else:
                over = mid
        floor = self._min_chunk * prompts
        return min(self._max_tokens, max(floor, fits))

    def observe(self, decodes: int, chunks: list[int], seconds: float) -> None:
        """Refine the model from a step of `decodes` decodes and prefill chunks of these sizes: a
        decode-only step refines the fixed cost, a step mixing both the prefill overhead."""
        c = self.cost
        if decodes == 0:
            return
        if not chunks:
            fixed = max(seconds - (c.decode_step_s(decodes) - c.fixed_s), 1e-6)
            c.fixed_s = (1 - _DECODE_SMOOTHING) * c.fixed_s + _DECODE_SMOOTHING * fixed
            return
        rows = c.decode_step_s(decodes) + c.prefill_s(decodes, chunks) - c.prefill_overhead_s * len(chunks)
        measured = max(0.0, (seconds - rows) / len(chunks))
        c.prefill_overhead_s = (1 - _SMOOTHING) * c.prefill_overhead_s + _SMOOTHING * measured


def calibrate(model: LlamaModel, cache: KVCache, clock: Clock, repeats: int = 3) -> StepCost:
    """Time decode steps of 1 and 8 sequences and prefill chunks at both sides of the model's
    GEMV/GEMM knee, on scratch blocks.

    The decode step's fixed cost is refined from every decode-only step after (observe), so a
    calibration upset by a busy moment corrects itself before a prompt joins.

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
        return min(times)  # a busy moment on a shared machine only ever adds

    def chunk(tokens: int) -> float:
        return timed(lambda: [ScheduledChunk(scratch(0, 0, tokens), tokens)])

    ctx, decodes, knee = _CALIBRATION_CONTEXT, _CALIBRATION_DECODES, model.knee_rows
    one = timed(lambda: [ScheduledChunk(scratch(0, ctx, ctx + 1), 1)])
    many = timed(lambda: [ScheduledChunk(scratch(i, ctx, ctx + 1), 1) for i in range(decodes)])
    # A chunk of `n` tokens is one decode's step (one logits row, a row) plus n - 1 rows; what a
    # chunk costs beyond its rows (its attention over its context) is learnt from the steps that
    # mix both (observe). The GEMM's slope is read up to a chunk of 64 rows or more, where the
    # GEMM's fixed part weighs little.
    wide_rows = 4 * max(knee, _GEMM_CHUNK)
    wide = chunk(wide_rows)
    jump = 0.0  # what a step's second row costs beyond its slope: the GEMM's fixed part
    if knee > 1:
        # From the knee on, the line through the GEMVs at the knee and the wide GEMM is the GEMM's:
        # at the crossover the GEMVs cost what the GEMM's fixed part and its rows do.
        at_knee = chunk(knee)
        per_row = max((at_knee - one) / (knee - 1), 1e-6)
        per_row_gemm = max((wide - at_knee) / (wide_rows - knee), per_row / 8)
    else:
        # No GEMV rows beyond a lone decode's: from two rows on a step is one GEMM, its fixed part
        # paid once and each row at the GEMM's slope, read between two chunks that are both GEMMs.
        # The model stays a line (per_row and per_row_gemm the same slope) whose fixed part holds
        # the GEMM's: right from two rows on, and a lone decode (a GEMV) over-estimated by that
        # fixed part, at most a GEMV row per projection where the knee is 1.
        narrow = chunk(_GEMM_CHUNK)
        per_row_gemm = max((wide - narrow) / (wide_rows - _GEMM_CHUNK), 1e-6)
        per_row = per_row_gemm
        jump = max(narrow - one - per_row_gemm * (_GEMM_CHUNK - 1), 0.0)
    rows = StepCost(0.0, per_row, per_row_gemm, knee_rows=knee)
    # A decode is a row plus its logits row and its attention: what the decodes cost beyond the
    # rows the model already counts for them, whichever side of the knee 8 decodes fall.
    grown = many - one - jump - (rows.rows_s(decodes) - rows.rows_s(1))
    per_decode = max(grown / (decodes - 1), 0.0)
    fixed = max(one + jump - per_decode - per_row, 1e-6)
    return StepCost(fixed, per_row, per_row_gemm, per_decode, knee_rows=knee)
