"""The prefill budget as a time budget: how many prompt tokens a step may carry so that the streams
already decoding are slowed by at most a set factor.

A fixed token budget cannot do that on a CPU: 512 prompt tokens cost a few milliseconds on the
2-layer demo model and several seconds on SmolLM2-135M, during which every running stream stops.
So the engine measures its step cost when it starts (a short calibration on the real model and a
scratch corner of the KV pool) and models a step of `d` decodes and prefill chunks of `n` tokens as

    seconds = fixed + per_decode * d + keys + rows(d + sum n) + attention + prefill_overhead * chunks

rows(r) is what the projections cost for r rows of the batch, and it bends at the model's knee
(model.py, measured at start by gemv_knee.py): up to knee_rows rows each row is its own GEMV
(per_row each, the weights re-read from the cache), beyond them the batch is one GEMM (its fixed
part, gemm_jump, once, and per_row_gemm a row). Where the knee is high (16 rows on an AMD EPYC, a
GEMM row a third of a GEMV row) a prompt token next to a few decodes costs per_row, not the GEMM's
per-token cost a large chunk shows: the budget used to take the latter, put 3x the tokens in a step
that it had time for, and the decodes paid for it. Where it is low (2-3 rows on an Intel Xeon)
nearly every step is one GEMM; at a knee of 1 the two slopes are one, and the line's fixed part
holds the GEMM's (calibrate). per_decode is what a decode costs beyond its row and its keys (its
logits row); keys and attention are below.

A step with `d` running streams may carry the most tokens whose cost stays within (slowdown - 1)
times the decode-only step, found by bisection; with no stream decoding (an idle engine, or a burst
of arrivals all still prefilling) nobody is waiting on a decode, and the token cap alone applies.

A prefill chunk also attends: it reads the K and V of every key before it and of itself
(key_read_s a key, whatever its size: the reads dominate a small chunk late in a long prompt) and
scores n * context + n * (n + 1) / 2 query-key pairs (attention_s each). On the AMD EPYC a 16-token
chunk next to 4 decodes grew from 188 to 278 ms of CPU over a 2,000-token prompt, and a 1-token
chunk at 1,800 tokens of context still cost 34 ms more than at none. Modelled as a cost per chunk
instead (as it was), the budget priced a 1-token chunk like a 16-token one, found no chunk that fit
the slack and fell back on the floor, so every step with a long prompt in it overshot. A decode
reads and scores its keys through its own products (decode_key_s a key, attention.py's
_attend_one): its step grows as the streams' contexts do, and the slack with it. The three are
calibrated at start from chunks of 1, 2 and 16 tokens, each at context 0 and 1,024 (the same rows:
each difference is attention alone).

prefill_overhead is what a prefill chunk costs beyond its rows and its attention: whatever the model
misses, refined by each step that carries prefill next to decodes (an exponential average of what
steps took beyond the model), so the chunk shrinks if the model under-prices it. Only that term is
refined: attributing the excess to the per-token or per-pair costs instead would shrink the chunk,
which makes a per-chunk cost weigh more per token, which shrinks the chunk again, down to one token
a step.

min_chunk is a floor per prompt when several wait for their prefill: each gets at least that many
tokens a step, whatever the time budget says. Without it a wave of 15 arrivals next to one decoding
stream shares the few tokens the slack allows, each new user waiting behind the others. The floor
trades the other way: those steps slow the decoding streams more than `slowdown`. A prompt alone
gets what the time budget gives, at least one token: with a chunk priced by its attention the
budget finds one that fits, and a floor there only pushed steps past the slowdown (on the EPYC,
with a knee of 7 rows next to 4 decodes, a floor of 4 tokens made a step of 8 rows one GEMM: 1.8-1.9x
a decode step where the 3 tokens the time allowed cost 1.6x). `min_prefill_chunk = 1` gives the
time budget alone, for a deployment that puts inter-token latency first.

With a prefill lane (prefill_lane.py) there is no budget in time: the prefill runs beside the decode
steps instead of in them, and they do not wait for it; the engine does not calibrate.

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
from typing import NamedTuple

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
# The narrower of the two chunks that measure the GEMM's slope when there are no GEMV rows (knee 1),
# and the chunk whose attention is timed at two contexts.
_GEMM_CHUNK = 16
# The longer of those two contexts: long enough that attention dwarfs a busy moment's noise, and
# that its K/V outgrow the caches as a long prompt's do (47 MB over SmolLM2's 30 layers).
_ATTENTION_CONTEXT = 1024

Clock = Callable[[], float]


def step_clock(blas_threads: int) -> Clock:
    """CPU time of the stepping thread when it does all the work, else the wall clock."""
    return time.thread_time if blas_threads == 1 else time.perf_counter


class PromptChunk(NamedTuple):
    """`tokens` of one prompt in a step, after the `context` tokens of it already computed."""

    tokens: int
    context: int = 0

    @property
    def keys(self) -> int:
        """Keys its attention reads: the context and the chunk itself."""
        return self.context + self.tokens

    @property
    def pairs(self) -> int:
        """Query-key pairs its attention scores (each token sees the context and the chunk up to it)."""
        return self.tokens * self.context + self.tokens * (self.tokens + 1) // 2


@dataclass(slots=True)
class StepCost:
    fixed_s: float
    per_row_s: float  # a batch row up to knee_rows (one GEMV per row)
    per_row_gemm_s: float = 0.0  # a row beyond them (the batch as one GEMM)
    gemm_jump_s: float = 0.0  # what crossing the knee costs beyond that row: the GEMM's fixed part
    per_decode_s: float = 0.0  # what a decode costs beyond its row and its keys: its logits row
    decode_key_s: float = 0.0  # a key a decode's attention reads and scores
    key_read_s: float = 0.0  # a key a prefill chunk's attention reads (its K and V in every layer)
    attention_s: float = 0.0  # a query-key pair a prefill chunk's attention scores
    prefill_overhead_s: float = 0.0
    knee_rows: int = MAX_KNEE_ROWS

    def rows_s(self, rows: int) -> float:
        below = min(rows, self.knee_rows)
        beyond = max(0, rows - self.knee_rows)
        return self.per_row_s * below + (self.gemm_jump_s + self.per_row_gemm_s * beyond if beyond else 0.0)

    def decode_step_s(self, decodes: int, keys: int = 0) -> float:
        """A step of `decodes` decodes whose contexts hold `keys` keys in all (a decode scores each
        of its keys once)."""
        attention = self.decode_key_s * keys
        return self.fixed_s + self.per_decode_s * decodes + self.rows_s(decodes) + attention

    def prefill_s(self, decodes: int, chunks: Iterable[PromptChunk]) -> float:
        """What these prefill chunks add to a step of `decodes` decodes."""
        listed = list(chunks)
        grown = self.rows_s(decodes + sum(c.tokens for c in listed)) - self.rows_s(decodes)
        attention = sum(self.key_read_s * c.keys + self.attention_s * c.pairs for c in listed)
        return grown + attention + self.prefill_overhead_s * len(listed)


class PrefillBudget:
    """Prompt tokens allowed in a step, given the sequences that decode in it."""

    def __init__(self, cost: StepCost, slowdown: float, max_tokens: int, min_chunk: int = 1) -> None:
        if slowdown <= 1:
            raise ValueError("prefill_slowdown must be above 1")
        if min_chunk < 1:
            raise ValueError("min_prefill_chunk must be at least 1")
        self.cost = cost
        self._slowdown = slowdown
        self._max_tokens = max_tokens
        self._min_chunk = min(min_chunk, max_tokens)

    def tokens(self, decodes: int, prompts: int = 1, context: int = 0, decode_keys: int = 0) -> int:
        """Prompt tokens for a step with `decodes` decoding sequences (holding `decode_keys` keys in
        all) and `prompts` prompts pending, the first of which has `context` tokens computed."""
        if decodes == 0:
            return self._max_tokens
        slack = (self._slowdown - 1) * self.cost.decode_step_s(decodes, decode_keys) * (1 + 1e-9)  # rounding
        fits, over = 0, self._max_tokens + 1  # the most tokens within the slack, by bisection
        while over - fits > 1:
            mid = (fits + over) // 2
            if self.cost.prefill_s(decodes, [PromptChunk(mid, context)]) <= slack:
                fits = mid
            else:
                over = mid
        floor = self._min_chunk * prompts if prompts > 1 else 1
        return min(self._max_tokens, max(floor, fits))

    def observe(self, decodes: int, chunks: list[PromptChunk], seconds: float, decode_keys: int = 0) -> None:
        """Refine the model from a step of `decodes` decodes (holding `decode_keys` keys) and these
        prefill chunks: a decode-only step refines the fixed cost, a step mixing both the prefill
        overhead."""
        c = self.cost
        if decodes == 0:
            return
        decode_s = c.decode_step_s(decodes, decode_keys)
        if not chunks:
            fixed = max(seconds - (decode_s - c.fixed_s), 1e-6)
            c.fixed_s = (1 - _DECODE_SMOOTHING) * c.fixed_s + _DECODE_SMOOTHING * fixed
            return
        modelled = decode_s + c.prefill_s(decodes, chunks) - c.prefill_overhead_s * len(chunks)
        measured = max(0.0, (seconds - modelled) / len(chunks))
        c.prefill_overhead_s = (1 - _SMOOTHING) * c.prefill_overhead_s + _SMOOTHING * measured


def calibrate(model: LlamaModel, cache: KVCache, clock: Clock, repeats: int = 3) -> StepCost:
    """Time decode steps of 1 and 8 sequences, prefill chunks at both sides of the model's
    GEMV/GEMM knee, and chunks at two contexts (their attention), on scratch blocks.

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

    def chunk(tokens: int, context: int = 0) -> float:
        return timed(lambda: [ScheduledChunk(scratch(0, context, context + tokens), tokens)])

    ctx, decodes, knee = _CALIBRATION_CONTEXT, _CALIBRATION_DECODES, model.knee_rows
    one = timed(lambda: [ScheduledChunk(scratch(0, ctx, ctx + 1), 1)])
    many = timed(lambda: [ScheduledChunk(scratch(i, ctx, ctx + 1), 1) for i in range(decodes)])
    # A chunk of `n` tokens is one decode's step (one logits row, a row) plus n - 1 rows and its
    # attention (_attention_costs); what else it costs is learnt from the steps that mix both
    # (observe). The GEMM's slope is read up to a chunk of 64 rows or more, where the
    # GEMM's fixed part weighs little.
    wide_rows = 4 * max(knee, _GEMM_CHUNK)
    wide = chunk(wide_rows)
    jump = 0.0  # what a step's second row costs beyond its slope: the GEMM's fixed part
    gemm_jump = 0.0
    if knee > 1:
        # GEMVs up to the knee, then one GEMM: the line from one row past the knee to the wide
        # chunk is the GEMM's, and what the row past the knee costs beyond the GEMVs at the knee
        # and one GEMM row is the step's jump there. The knee is measured on one matrix in the
        # cache and may sit a few rows off the whole model's crossover (7-15 on the AMD EPYC
        # across starts): a line drawn straight from the GEMVs at the knee to the wide GEMM
        # priced a step of 11 rows at 178 ms where it took 226.
        at_knee, past = chunk(knee), chunk(knee + 1)
        per_row = max((at_knee - one) / (knee - 1), 1e-6)
        per_row_gemm = max((wide - past) / (wide_rows - knee - 1), per_row / 8)
        gemm_jump = max(past - at_knee - per_row_gemm, 0.0)
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
    decode_key, key_read, attention = _attention_costs(chunk, model, cache)
    rows = StepCost(0.0, per_row, per_row_gemm, gemm_jump, knee_rows=knee)
    # A decode is a row, its logits row and its attention over its keys: what the decodes cost
    # beyond the rows and the keys the model already counts for them, whichever side of the knee
    # 8 decodes fall.
    keys = decode_key * (ctx + 1)
    grown = many - one - jump - (rows.rows_s(decodes) - rows.rows_s(1)) - keys * (decodes - 1)
    per_decode = max(grown / (decodes - 1), 0.0)
    fixed = max(one + jump - per_decode - per_row - keys, 1e-6)
    return StepCost(
        fixed, per_row, per_row_gemm, gemm_jump, per_decode, decode_key, key_read, attention, knee_rows=knee
    )


def _attention_costs(
    chunk: Callable[[int, int], float], model: LlamaModel, cache: KVCache
) -> tuple[float, float, float]:
    """(decode_key_s, key_read_s, attention_s) from chunks of 1, 2 and _GEMM_CHUNK tokens, each at
    context 0 and at a long context: the same rows at both, so each difference is attention alone.
    A lone token is a decode (its own product, attention.py's _attend_one); the two chunks read as
    many keys as each other and score 2 and _GEMM_CHUNK times as many pairs."""
    far = min(
        _ATTENTION_CONTEXT,
        model.config.max_position_embeddings - _GEMM_CHUNK,
        cache.num_blocks * cache.block_size - _GEMM_CHUNK,
    )
    if far <= 0:
        return 0.0, 0.0, 0.0
    lone = chunk(1, far) - chunk(1, 0)  # decode_key * far
    pair = chunk(2, far) - chunk(2, 0)  # key_read * far + attention * 2 * far
    wide = chunk(_GEMM_CHUNK, far) - chunk(_GEMM_CHUNK, 0)  # key_read * far + attention * 16 * far
    attention = max((wide - pair) / ((_GEMM_CHUNK - 2) * far), 0.0)
    return max(lone / far, 0.0), max(pair / far - 2 * attention, 0.0), attention
