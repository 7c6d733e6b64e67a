"""The prefill budget in time (step_budget.py) and the static batching kept for comparison: both
are scheduler rules, tested on the scheduler alone and on a running engine."""

from __future__ import annotations

import pytest

from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.scheduler import ScheduledChunk, Scheduler
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.step_budget import PrefillBudget, PromptChunk, StepCost
from gpu_container.engine.types import EngineConfig, SamplingParams
from tests.engine.collector import TIMEOUT_S, Collector
from tests.engine.tiny_llama import tiny_model

PARAMS = SamplingParams(max_new_tokens=50, temperature=0.0)


def _seq(request_id: str, prompt_len: int, arrival: int) -> Sequence:
    return Sequence(request_id, [3] * prompt_len, PARAMS, lambda _: None, 0, arrival)


def _run(scheduler: Scheduler) -> list[ScheduledChunk]:
    """One step: schedule, then record the chunks and a sampled token for those that completed."""
    chunks = scheduler.schedule()
    for seq in scheduler.advance(chunks):
        scheduler.postprocess(seq, 2)
    return chunks


def test_budget_follows_the_decode_step_time() -> None:
    cost = StepCost(fixed_s=0.040, per_row_s=0.002, per_row_gemm_s=0.001, knee_rows=16)
    budget = PrefillBudget(cost, slowdown=1.5, max_tokens=512)
    assert budget.tokens(0) == 512  # nobody is decoding: only the token cap applies
    assert budget.tokens(1) == int(0.5 * 0.042 / 0.002)  # 11 rows: all below the knee
    assert budget.tokens(16) == int(0.5 * 0.072 / 0.001)  # every prompt row beyond it
    assert budget.tokens(10_000) == 512


def test_prompt_rows_cost_the_gemv_slope_up_to_the_knee_and_the_gemm_slope_beyond() -> None:
    """12 decodes leave 32 ms: 4 rows up to the knee at 2 ms, then 24 rows at 1 ms."""
    cost = StepCost(fixed_s=0.040, per_row_s=0.002, per_row_gemm_s=0.001, knee_rows=16)
    assert cost.decode_step_s(12) == pytest.approx(0.064)
    assert PrefillBudget(cost, slowdown=1.5, max_tokens=512).tokens(12) == 4 + 24
    assert cost.prefill_s(12, [PromptChunk(28)]) == pytest.approx(0.032)
    with_decode_cost = StepCost(fixed_s=0.040, per_row_s=0.002, per_decode_s=0.003, knee_rows=16)
    assert with_decode_cost.decode_step_s(2) == pytest.approx(0.050)  # a decode is a row and more
    assert with_decode_cost.prefill_s(2, [PromptChunk(5)]) == pytest.approx(0.010)  # a prompt token is a row


def test_a_per_chunk_overhead_shrinks_the_chunk_once_not_down_to_one_token() -> None:
    """Steps cost 10 ms more than the model says whatever the chunk (a long context's gather):
    the budget settles at the chunk that fits the slack, it does not spiral down to 1 token."""
    cost = StepCost(fixed_s=0.036, per_row_s=0.001, per_row_gemm_s=0.001)
    budget = PrefillBudget(cost, slowdown=1.5, max_tokens=512)
    assert budget.tokens(4) == 20
    for _ in range(50):
        chunk = budget.tokens(4)
        budget.observe(decodes=4, chunks=[PromptChunk(chunk)], seconds=0.040 + 0.010 + 0.001 * chunk)
    assert budget.tokens(4) in (9, 10)  # (20 ms slack - 10 ms overhead) / 1 ms a token
    budget.observe(decodes=0, chunks=[PromptChunk(10)], seconds=100.0)  # prefill alone says nothing
    assert budget.tokens(4) in (9, 10)
    assert budget.tokens(0) == 512


def test_decode_only_steps_correct_a_calibration_that_was_off() -> None:
    """Calibrated on a busy moment (fixed 100 ms); decode steps of 4 take 48 ms: the slack
    follows them, and a prompt gets what 48 ms leaves, not what 100 ms would."""
    cost = StepCost(fixed_s=0.100, per_row_s=0.002, per_row_gemm_s=0.002)
    budget = PrefillBudget(cost, slowdown=1.5, max_tokens=512)
    assert budget.tokens(4) == 27
    for _ in range(200):
        budget.observe(decodes=4, chunks=[], seconds=0.048)
    assert cost.decode_step_s(4) == pytest.approx(0.048)
    assert budget.tokens(4) == 12


def test_the_overhead_is_per_chunk() -> None:
    """Two chunks in a step that took 20 ms beyond its rows: 10 ms each."""
    cost = StepCost(fixed_s=0.036, per_row_s=0.001, per_row_gemm_s=0.001)
    budget = PrefillBudget(cost, slowdown=1.5, max_tokens=512)
    for _ in range(50):
        budget.observe(decodes=4, chunks=[PromptChunk(3), PromptChunk(5)], seconds=0.040 + 0.008 + 0.020)
    assert cost.prefill_overhead_s == pytest.approx(0.010)


def test_every_prompt_of_a_wave_gets_at_least_the_floor_and_a_lone_prompt_what_the_time_allows() -> None:
    """4 decodes leave room for 5 tokens by time: that is all a lone prompt gets, floor or not;
    with a floor of 16 each of several waiting prompts gets 16 (their TTFT bounded), capped by
    the token budget."""
    cost = StepCost(fixed_s=0.024, per_row_s=0.004, per_row_gemm_s=0.004)
    assert PrefillBudget(cost, slowdown=1.5, max_tokens=512).tokens(4) == 5
    floored = PrefillBudget(cost, slowdown=1.5, max_tokens=512, min_chunk=16)
    assert floored.tokens(4, prompts=1) == 5
    assert floored.tokens(4, prompts=2) == 32
    assert floored.tokens(4, prompts=5) == 80
    assert floored.tokens(4, prompts=100) == 512
    assert floored.tokens(0) == 512  # nobody decoding: the whole token budget
    floored.observe(decodes=4, chunks=[PromptChunk(16)], seconds=10.0)  # a huge overhead estimate
    assert floored.tokens(4, prompts=5) == 80  # the floor still holds
    assert floored.tokens(4, prompts=1) == 1  # a lone prompt still advances
    roomy = StepCost(fixed_s=0.384, per_row_s=0.004, per_row_gemm_s=0.004)
    assert PrefillBudget(roomy, slowdown=1.5, max_tokens=512, min_chunk=8).tokens(4, prompts=5) == 50
    assert PrefillBudget(cost, slowdown=1.5, max_tokens=8, min_chunk=16).tokens(4, prompts=5) == 8


def test_a_wave_of_arrivals_next_to_one_decode_gets_a_floor_each() -> None:
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=64)
    cost = StepCost(fixed_s=0.040, per_row_s=0.004, per_row_gemm_s=0.004)
    budget = PrefillBudget(cost, slowdown=1.5, max_tokens=64, min_chunk=8)
    scheduler = Scheduler(config, BlockManager(64, 4, False), budget.tokens)
    scheduler.add(_seq("first", 4, 0))
    _run(scheduler)
    for i in range(3):
        scheduler.add(_seq(f"late-{i}", 8, 1 + i))
    chunks = {c.seq.request_id: c.num_tokens for c in _run(scheduler)}
    assert chunks == {"first": 1, "late-0": 8, "late-1": 8, "late-2": 8}


def test_a_prompt_with_nobody_decoding_takes_the_whole_token_budget() -> None:
    """An idle engine, or a burst of arrivals all still prefilling: nobody waits on a decode, so the
    time budget does not apply; once one of them decodes, the other gets what the time allows."""
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=48)
    cost = StepCost(fixed_s=0.040, per_row_s=0.004, per_row_gemm_s=0.004)
    budget = PrefillBudget(cost, slowdown=1.5, max_tokens=48)
    scheduler = Scheduler(config, BlockManager(64, 4, False), budget.tokens)
    scheduler.add(_seq("first", 20, 0))
    scheduler.add(_seq("second", 40, 1))
    assert {c.seq.request_id: c.num_tokens for c in _run(scheduler)} == {"first": 20, "second": 28}
    # "first" now decodes: the rest of "second" joins by time (22 ms, 4 ms a token), not at the cap.
    assert {c.seq.request_id: c.num_tokens for c in _run(scheduler)} == {"first": 1, "second": 5}


@pytest.mark.parametrize("min_chunk", [0, -3])
def test_a_floor_below_one_token_is_refused(min_chunk: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PrefillBudget(StepCost(0.01, 0.001), 1.5, 64, min_chunk)


def test_a_long_prompt_joins_in_budgeted_chunks_while_others_decode() -> None:
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)
    scheduler = Scheduler(config, BlockManager(64, 4, False), lambda *, decodes, **_: 3 if decodes else 64)
    scheduler.add(_seq("short", 4, 0))
    _run(scheduler)  # the short prompt alone: prefilled whole, first token sampled
    scheduler.add(_seq("long", 40, 1))
    chunks = _run(scheduler)
    assert {c.seq.request_id: c.num_tokens for c in chunks} == {"short": 1, "long": 3}


def test_static_batching_admits_nobody_until_the_batch_ends() -> None:
    config = EngineConfig(
        block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, batching="static"
    )
    scheduler = Scheduler(config, BlockManager(64, 4, False))
    first, second = _seq("a", 4, 0), _seq("b", 4, 1)
    scheduler.add(first)
    scheduler.add(second)
    _run(scheduler)
    late = _seq("late", 4, 2)
    scheduler.add(late)
    _run(scheduler)
    assert late in scheduler.waiting
    scheduler.remove(first)
    assert scheduler.is_padding(first) and first.block_table  # keeps its slot, blocks and row
    assert [c.seq.request_id for c in _run(scheduler)] == ["a", "b"]
    assert late in scheduler.waiting  # "b" still runs: the batch ends with its longest member
    scheduler.remove(second)
    assert [c.seq.request_id for c in _run(scheduler)] == ["late"]
    assert not first.block_table and not scheduler.is_padding(first)


def test_a_static_engine_answers_only_real_requests_and_frees_every_block() -> None:
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, batching="static")
    engine = LLMEngine(tiny_model()[0], config, eos_token_ids=[1])
    seen = Collector()
    lengths = {"short": 2, "long": 12, "next": 3}
    for rid, n in lengths.items():
        engine.add_request(rid, [5, 6, 7], SamplingParams(max_new_tokens=n, ignore_eos=True), seen)
    engine.start()
    try:
        seen.wait_finished(*lengths)
        assert engine.wait_until_idle(TIMEOUT_S)
    finally:
        engine.stop()
    assert {rid: len(seen.tokens(rid)) for rid in lengths} == lengths
    assert all(len([o for o in seen.outputs[rid] if o.finish_reason]) == 1 for rid in lengths)
    assert engine.stats().free_blocks == config.num_blocks


def test_a_calibrated_engine_serves_with_a_time_budget() -> None:
    config = EngineConfig(
        block_size=4, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=32, prefill_slowdown=1.5
    )
    engine = LLMEngine(tiny_model()[0], config, eos_token_ids=[1])
    engine.start()
    seen = Collector()
    try:
        engine.add_request("a", [5, 6, 7] * 10, SamplingParams(max_new_tokens=8, ignore_eos=True), seen)
        seen.wait_finished("a")
        assert engine.wait_until_idle(TIMEOUT_S)
    finally:
        engine.stop()
    assert len(seen.tokens("a")) == 8
    assert engine.stats().free_blocks == config.num_blocks


@pytest.mark.parametrize("slowdown", [0.5, 1.0])
def test_a_slowdown_of_one_or_less_is_refused(slowdown: float) -> None:
    with pytest.raises(ValueError, match="above 1"):
        PrefillBudget(StepCost(0.01, 0.001), slowdown, 64)


def test_the_scheduler_tells_the_budget_where_the_prompt_is_and_how_long_the_decodes_are() -> None:
    """A chunk's attention grows with its prompt's context and a decode's with its own: the
    scheduler hands the budget both, the prompt's as it advances chunk by chunk."""
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)
    asked: list[dict[str, int]] = []

    def rule(*, decodes: int, prompts: int, context: int, decode_keys: int) -> int:
        asked.append({"decodes": decodes, "prompts": prompts, "context": context, "decode_keys": decode_keys})
        return 5 if decodes else 64

    scheduler = Scheduler(config, BlockManager(64, 4, False), rule)
    scheduler.add(_seq("short", 6, 0))
    _run(scheduler)  # prefilled whole: 6 tokens, its first token sampled
    scheduler.add(_seq("long", 40, 1))
    _run(scheduler)  # "short" decodes (6 computed + its new token), "long" gets 5 tokens
    _run(scheduler)
    assert asked[1] == {"decodes": 1, "prompts": 1, "context": 0, "decode_keys": 7}
    assert asked[2] == {"decodes": 1, "prompts": 1, "context": 5, "decode_keys": 8}


def test_longer_decodes_leave_more_slack_for_a_prompt() -> None:
    """Four decodes 2,000 tokens in cost more than four 40 tokens in: the same slowdown of a
    longer decode step leaves room for more prompt tokens."""
    cost = StepCost(fixed_s=0.040, per_row_s=0.002, per_row_gemm_s=0.002, decode_key_s=10e-6)
    budget = PrefillBudget(cost, slowdown=1.5, max_tokens=512)
    short = budget.tokens(decodes=4, decode_keys=4 * 40)
    long = budget.tokens(decodes=4, decode_keys=4 * 2000)
    assert cost.decode_step_s(4, 4 * 2000) == pytest.approx(0.048 + 0.080)
    assert long > short >= 1
