"""Prefix caching through the whole engine with a real (tiny, random) model: greedy output is the
same with the cache on and off, whatever shares, preempts or cancels, and the cache really serves
the later turns of a conversation."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.types import EngineConfig, EngineStats, SamplingParams
from tests.engine.collector import TIMEOUT_S, Collector
from tests.engine.tiny_llama import tiny_model

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18, 19]


@cache
def _model() -> LlamaModel:
    return tiny_model()[0]


def _engine(caching: bool, num_blocks: int = 16) -> LLMEngine:
    config = EngineConfig(
        block_size=4,
        num_blocks=num_blocks,
        max_num_seqs=6,
        max_num_batched_tokens=12,
        max_model_len=64,
        enable_prefix_caching=caching,
    )
    return LLMEngine(_model(), config, eos_token_ids=[1])


@dataclass(frozen=True)
class Turn:
    shared_system: bool
    user: list[int]
    max_new: int
    priority: int
    cancel: bool


turns = st.builds(
    Turn,
    shared_system=st.booleans(),
    user=st.lists(st.integers(2, 96), min_size=1, max_size=9),
    max_new=st.integers(1, 6),
    priority=st.integers(0, 2),
    cancel=st.booleans(),
)


def _run(engine: LLMEngine, prompts: dict[str, tuple[list[int], Turn]], cancels: bool) -> Collector:
    """Queue every prompt, cancelling some right after they are queued; wait for all to end."""
    seen = Collector()
    for rid, (prompt, turn) in prompts.items():
        params = SamplingParams(max_new_tokens=turn.max_new, temperature=0.0, ignore_eos=True)
        engine.add_request(rid, prompt, params, seen, priority=turn.priority)
        if cancels and turn.cancel:
            engine.abort(rid)
    assert engine.wait_until_idle(TIMEOUT_S)
    return seen


def _conversation(
    engine: LLMEngine, first: list[Turn], second: list[Turn], cancels: bool
) -> tuple[dict[str, list[int]], EngineStats]:
    """Two rounds: each second-round prompt resends a first-round prompt and its reply, like a chat."""
    engine.start()
    try:
        round1 = {f"a{i}": ((SYSTEM if t.shared_system else []) + t.user, t) for i, t in enumerate(first)}
        seen = _run(engine, round1, cancels)
        round2 = {}
        for i, t in enumerate(second):
            history, _ = round1[f"a{i % len(first)}"]
            round2[f"b{i}"] = (history + seen.tokens(f"a{i % len(first)}") + t.user, t)
        seen2 = _run(engine, round2, cancels)
        stats = engine.stats()
    finally:
        engine.stop()
    outputs = {rid: seen.tokens(rid) for rid in round1} | {rid: seen2.tokens(rid) for rid in round2}
    assert stats.free_blocks == stats.num_blocks and stats.running == stats.waiting == 0
    return outputs, stats


@settings(max_examples=25, deadline=None)
@given(first=st.lists(turns, min_size=1, max_size=6), second=st.lists(turns, max_size=6))
def test_greedy_output_is_the_same_with_the_cache_on_and_off(first: list[Turn], second: list[Turn]) -> None:
    # Without cancels both runs see the same prompts, so every output must match exactly.
    off, _ = _conversation(_engine(caching=False), first, second, cancels=False)
    on, _ = _conversation(_engine(caching=True), first, second, cancels=False)
    assert on == off


@settings(max_examples=15, deadline=None)
@given(first=st.lists(turns, min_size=1, max_size=6))
def test_cancels_and_preemption_with_the_cache_on_leave_correct_prefixes(first: list[Turn]) -> None:
    # A cancel cuts a reply short at a moment that depends on timing; what came out must still be
    # the start of the reply the uncached engine gives, and nothing may stay held afterwards.
    off, _ = _conversation(_engine(caching=False), first, [], cancels=False)
    on, _ = _conversation(_engine(caching=True, num_blocks=10), first, first, cancels=True)
    for rid, tokens in on.items():
        if rid.startswith("a"):
            assert tokens == off[rid][: len(tokens)], rid


def test_later_turns_of_a_conversation_are_served_from_the_cache() -> None:
    first = [Turn(True, [20 + i, 30 + i, 40 + i], 6, 0, False) for i in range(3)]
    second = [Turn(True, [50, 51], 4, 0, False) for _ in range(3)]
    _, on = _conversation(_engine(caching=True, num_blocks=64), first, second, cancels=False)
    _, off = _conversation(_engine(caching=False, num_blocks=64), first, second, cancels=False)
    assert off.prefix_hit_tokens == 0
    # Round 2: each prompt (9 + 3 + 6 + 2 = 20 tokens) finds its first four blocks cached. Round 1:
    # the prompts admitted after the first one computed the 8-token system prompt share it.
    assert 3 * 16 <= on.prefix_hit_tokens <= 2 * 8 + 3 * 16
    assert on.prefix_query_tokens == 3 * 12 + 3 * 20
    assert on.prefix_hit_rate == on.prefix_hit_tokens / on.prefix_query_tokens
    assert on.cached_blocks > 0
