"""The GEMV/GEMM knee (gemv_knee.py): measured as the crossover of the two ways' times, followed by
the model without changing what it computes, and the step cost model calibrated at it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpu_container.engine import gemv_knee
from gpu_container.engine.arrays import Floats
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.gemv_knee import crossover, measure_knee
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.step_budget import PrefillBudget, PromptChunk, calibrate
from gpu_container.engine.types import EngineConfig, SamplingParams
from tests.engine.collector import TIMEOUT_S, Collector
from tests.engine.tiny_llama import tiny_model


class FakeMachine:
    """Seconds a projection of `rows` rows costs: g per row as GEMVs, f + s per row as one GEMM
    (one row is a GEMV either way), and a clock that only these costs advance."""

    def __init__(self, gemv_s: float, gemm_fixed_s: float, gemm_row_s: float) -> None:
        self.g, self.f, self.s = gemv_s, gemm_fixed_s, gemm_row_s
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def rows_s(self, rows: int, knee: int) -> float:
        if rows == 1 or rows <= knee:
            return self.g * rows
        return self.f + self.s * rows

    def true_knee(self) -> int:
        below = [r for r in range(2, 17) if self.g * r < self.f + self.s * r]
        return max([1, *below])


# The 576x3072 gate/up matrix in microseconds of thread CPU time (the measurements):
# an Intel Xeon, where the GEMM wins from 3 rows; and a machine like the AMD EPYC the engine was
# first measured on, where GEMVs win up to 16 rows.
XEON = (465e-6, 870e-6, 92e-6)
EPYC = (100e-6, 1_150e-6, 30e-6)


@pytest.mark.parametrize(("machine", "knee"), [(XEON, 2), (EPYC, 16), ((465e-6, 10e-6, 100e-6), 1)])
def test_the_measured_knee_is_the_crossover(
    monkeypatch: pytest.MonkeyPatch, machine: tuple[float, float, float], knee: int
) -> None:
    fake = FakeMachine(*machine)
    assert fake.true_knee() == knee
    calls = 0

    def timed_linear(x: Floats, weight: Floats, knee_rows: int) -> Floats:
        nonlocal calls
        calls += 1
        # The first round is busy (another process on the core): it must not decide the knee.
        fake.now += fake.rows_s(x.shape[0], knee_rows) * (5.0 if calls <= 4 else 1.0)
        return x @ weight

    monkeypatch.setattr(gemv_knee, "linear", timed_linear)
    assert measure_knee(np.zeros((8, 4), np.float32), fake.clock) == knee


def test_the_knee_stops_at_the_first_row_count_the_gemm_wins() -> None:
    assert crossover([1, 2, 3, 9, 5], [1, 5, 5, 5, 6]) == 3  # GEMVs lose at 4 rows
    assert crossover([1, 2], [1, 1]) == 1  # GEMM from two rows on
    assert crossover([1, 2, 3], [1, 5, 5]) == 3  # every row count measured: the GEMVs win


def test_greedy_ids_are_the_same_whatever_the_knee() -> None:
    prompts = {f"r{i}": [5 + i, 6, 7, 8 + i] * (1 + i) for i in range(6)}

    def serve(knee: int) -> dict[str, list[int]]:
        config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=6, gemv_knee_rows=knee)
        model = tiny_model()[0]
        engine = LLMEngine(model, config, eos_token_ids=[1])
        seen = Collector()
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, SamplingParams(max_new_tokens=12, temperature=0.0), seen)
        engine.start()
        try:
            seen.wait_finished(*prompts)
            assert engine.wait_until_idle(TIMEOUT_S)
        finally:
            engine.stop()
        assert model.knee_rows == knee
        return {rid: seen.tokens(rid) for rid in prompts}

    assert serve(1) == serve(4) == serve(16)


def test_an_engine_measures_its_knee_unless_set() -> None:
    model = tiny_model()[0]
    model.knee_rows = 0  # neither the default nor anything a measurement returns
    engine = LLMEngine(model, EngineConfig(block_size=4, num_blocks=64), eos_token_ids=[1])
    engine.start()
    engine.stop()
    assert 1 <= model.knee_rows <= 16


class TimedModel(LlamaModel):
    """The tiny model on a fake machine: a forward costs a fixed part, 30 layers of projections
    of its rows at the model's knee, a logits row and some attention per sequence, and, if given,
    the reading of each sequence's keys and the scoring of its query-key pairs."""

    def __init__(self, machine: FakeMachine, knee: int, key_read_s: float = 0.0, pair_s: float = 0.0) -> None:
        base = tiny_model()[0]
        super().__init__(base.config, base.weights)
        self.machine, self.knee_rows = machine, knee
        self.key_read_s, self.pair_s = key_read_s, pair_s

    def step_s(self, rows: int, sequences: int, chunks: tuple[PromptChunk, ...] = ()) -> float:
        attention = sum(self.key_read_s * c.keys + self.pair_s * c.pairs for c in chunks)
        return 2e-3 + 30 * self.machine.rows_s(rows, self.knee_rows) + 150e-6 * sequences + attention

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        chunks = tuple(PromptChunk(s.length, s.context_len - s.length) for s in batch.slices)
        self.machine.now += self.step_s(len(batch.token_ids), len(batch.slices), chunks)
        return super().forward(batch, cache)


GEMM_FROM_TWO = (465e-6, 300e-6, 92e-6)  # a machine whose knee is 1


@pytest.mark.parametrize(("machine", "knee"), [(XEON, 1), (XEON, 2), (GEMM_FROM_TWO, 1), (EPYC, 16)])
def test_the_calibrated_step_cost_is_monotone_and_near_the_truth(
    machine: tuple[float, float, float], knee: int
) -> None:
    """At the machine's knee, and at a knee of 1 (GEMM always, where calibration has no GEMV rows
    to measure) whether it is the machine's or set below it."""
    fake = FakeMachine(*machine)
    model = TimedModel(fake, knee)
    mc = model.config
    cache = KVCache.allocate(mc.num_hidden_layers, 64, 4, mc.num_key_value_heads, mc.head_dim)
    cost = calibrate(model, cache, fake.clock)
    assert cost.knee_rows == knee
    decode = [cost.decode_step_s(d) for d in range(1, 65)]
    assert all(b > a for a, b in itertools.pairwise(decode))
    grown = [cost.prefill_s(4, [PromptChunk(n)]) for n in range(0, 257)]
    assert all(b > a for a, b in itertools.pairwise(grown))
    for decodes in (2, 4, 8, 16, 32, 64):
        truth = model.step_s(decodes, decodes)
        assert cost.decode_step_s(decodes) == pytest.approx(truth, rel=0.35)
    # At a knee of 1 the line's fixed part holds the GEMM's, which a lone decode (a GEMV) does
    # not pay: over-estimated, by less than its projections' cost.
    alone = model.step_s(1, 1)
    assert alone * 0.9 <= cost.decode_step_s(1) <= (2 if knee == 1 else 1.1) * alone
    for decodes, tokens in ((4, 16), (8, 64), (16, 128)):
        truth = model.step_s(decodes + tokens, decodes + 1) - model.step_s(decodes, decodes)
        assert cost.prefill_s(decodes, [PromptChunk(tokens)]) == pytest.approx(truth, rel=0.35, abs=2e-3)


def test_calibration_prices_a_chunk_by_the_keys_it_reads_and_the_pairs_it_scores() -> None:
    """Reading a key costs 5 us and scoring a pair 0.5 us: a chunk late in a long prompt is dear,
    but a small one far less than a large one, so the budget still finds one that fits the slack
    (priced per chunk, a 1-token chunk cost what a 16-token one did, and none fit)."""
    fake = FakeMachine(*EPYC)
    model = TimedModel(fake, 16, key_read_s=5e-6, pair_s=0.5e-6)
    mc = model.config
    cache = KVCache.allocate(mc.num_hidden_layers, 64, 4, mc.num_key_value_heads, mc.head_dim)
    cost = calibrate(model, cache, fake.clock)
    assert cost.key_read_s == pytest.approx(5e-6, rel=0.05)
    assert cost.attention_s == pytest.approx(0.5e-6, rel=0.05)
    assert cost.decode_key_s == pytest.approx(5.5e-6, rel=0.05)  # a decode's key is read and scored
    decodes = (PromptChunk(1, 40),) * 4
    for chunk in (PromptChunk(1, 1000), PromptChunk(4, 1000), PromptChunk(16, 1000), PromptChunk(8, 0)):
        truth = model.step_s(4 + chunk.tokens, 5, (*decodes, chunk)) - model.step_s(4, 4, decodes)
        assert cost.prefill_s(4, [chunk]) == pytest.approx(truth, rel=0.2)
    budget = PrefillBudget(cost, slowdown=2.0, max_tokens=512)
    steady = model.step_s(4, 4, decodes)
    late = budget.tokens(decodes=4, context=1000, decode_keys=4 * 41)
    early = budget.tokens(decodes=4, context=0, decode_keys=4 * 41)
    assert 1 < late < early
    for tokens, context in ((late, 1000), (early, 0)):
        assert model.step_s(4 + tokens, 5, (*decodes, PromptChunk(tokens, context))) <= 2.0 * steady * 1.05
        assert model.step_s(5 + tokens, 5, (*decodes, PromptChunk(tokens + 1, context))) > 2.0 * steady * 0.95


def test_a_knee_set_below_the_machines_crossover_prices_the_gemm_it_jumps_to() -> None:
    """The EPYC-like machine's GEMVs win up to 16 rows, but the model's knee says 8 (a measurement
    off by a busy moment): a step of 9 rows is one GEMM, its fixed part paid at once. Calibration
    prices that step, and a budget whose slack does not cover the jump stays below the knee."""
    fake = FakeMachine(*EPYC)
    model = TimedModel(fake, 8)
    mc = model.config
    cache = KVCache.allocate(mc.num_hidden_layers, 64, 4, mc.num_key_value_heads, mc.head_dim)
    cost = calibrate(model, cache, fake.clock)
    decodes = (PromptChunk(1, 40),) * 4
    steady = model.step_s(4, 4, decodes)
    for tokens in (4, 5, 12, 60):
        truth = model.step_s(4 + tokens, 5, (*decodes, PromptChunk(tokens, 0))) - steady
        assert cost.prefill_s(4, [PromptChunk(tokens)]) == pytest.approx(truth, rel=0.1)
    budget = PrefillBudget(cost, slowdown=2.0, max_tokens=512)
    assert budget.tokens(decodes=4, decode_keys=4 * 41) == 4  # 8 rows; a 9th would cost the jump
