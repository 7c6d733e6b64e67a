"""An abort deferred by the prefill lane does not move the logits rows of the lane's other prompts
(engine._collect_lane), and a waiting prompt that could not be admitted anyway does not cut the
lane's work short (Scheduler.outranks_held)."""

from __future__ import annotations

import threading

from gpu_container.engine.arrays import Floats
from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.scheduler import Scheduler
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import EngineConfig, SamplingParams
from tests.engine.collector import TIMEOUT_S, Collector, tokens_alone
from tests.engine.tiny_llama import tiny_model

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
STREAM = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)
B = [40, 41, 42, 43, 44, 45]
FIRST, SECOND = 88, 77  # tokens whose lane forwards wait at a gate


class _GatedModel(LlamaModel):
    """The tiny model, except that a lane forward holding one of the gated tokens waits for the
    test to open that token's gate."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__(model.config, model.weights)
        self.entered = {t: threading.Event() for t in (FIRST, SECOND)}
        self.gate = {t: threading.Event() for t in (FIRST, SECOND)}

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        if threading.current_thread().name.startswith("llm-prefill-lane"):
            for token, gate in self.gate.items():
                if token in batch.token_ids:
                    self.entered[token].set()
                    assert gate.wait(TIMEOUT_S), "the test never opened the gate"
        return super().forward(batch, cache)

    def open(self) -> None:
        for gate in self.gate.values():
            gate.set()


def _config(prefix_cache: bool, lane: bool = True) -> EngineConfig:
    return EngineConfig(
        block_size=4,
        num_blocks=256,
        max_num_seqs=8,
        max_num_batched_tokens=16,
        max_model_len=512,
        prefill_lane="on" if lane else "off",
        enable_prefix_caching=prefix_cache,
    )


def _alone(prompt: list[int]) -> list[int]:
    return tokens_alone(tiny_model()[0], _config(False, lane=False), prompt, GREEDY)


def _abort_beside(prefix_cache: bool) -> None:
    """A stream decodes. A first lane work waits at a gate while prompt a (and b) arrive; then a
    second lane work carries a's last chunk, which completes it, and all of b's prompt. While it
    waits at a gate, a is aborted (deferred: the lane is writing its blocks). Once it is done, b
    must get the tokens it gets alone. Before the fix the engine finished a first, which reset its
    computed tokens, so a's chunk no longer counted as completing and b sampled a's logits row.

    With the prefix cache, a's first 8 tokens are cached (an earlier prompt x) and its last chunk
    is 2 tokens, after a gated prompt g; without, a's first chunk (15 tokens beside the stream's
    decode) is the first work and its last 5 tokens the second."""
    model = _GatedModel(tiny_model()[0])
    engine, seen = LLMEngine(model, _config(prefix_cache), eos_token_ids=[1]), Collector()
    engine.start()
    try:
        if prefix_cache:
            x = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
            engine.add_request("x", x, SamplingParams(max_new_tokens=1), seen)
            seen.wait_finished("x")
            a = [*x[:8], SECOND, 61]
        else:
            a = [FIRST, *((7 * i) % 60 + 3 for i in range(1, 17)), SECOND, 62, 63]
        engine.add_request("stream", [2, 3, 4], STREAM, seen)
        seen.wait_tokens("stream", 2)
        if prefix_cache:
            engine.add_request("g", [FIRST, 5, 6], GREEDY, seen)
            assert model.entered[FIRST].wait(TIMEOUT_S)
            engine.add_request("a", a, GREEDY, seen)
        else:
            engine.add_request("a", a, GREEDY, seen)
            assert model.entered[FIRST].wait(TIMEOUT_S)
        engine.add_request("b", B, GREEDY, seen)
        decoded = len(seen.tokens("stream"))
        seen.wait_tokens("stream", decoded + 3)  # the engine has stepped since b came: it waits
        model.gate[FIRST].set()
        assert model.entered[SECOND].wait(TIMEOUT_S)  # a's last chunk and b's prompt on the lane
        engine.abort("a")
        decoded = len(seen.tokens("stream"))
        seen.wait_tokens("stream", decoded + 3)  # the engine has stepped since the abort
        model.gate[SECOND].set()
        seen.wait_finished("a", "b")
        assert seen.finish_reason("a") == "cancelled"
        assert seen.tokens("a") == []
        assert seen.tokens("b") == _alone(B)
        engine.abort("stream")
        assert engine.wait_until_idle(TIMEOUT_S)
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        model.open()
        engine.stop()


def test_an_aborted_prompt_completed_from_the_prefix_cache_leaves_the_next_prompts_row() -> None:
    _abort_beside(prefix_cache=True)


def test_an_aborted_prompts_last_chunk_leaves_the_next_prompts_row() -> None:
    _abort_beside(prefix_cache=False)


def _seq(name: str, prompt_len: int, priority: int, arrival: int) -> Sequence:
    params = SamplingParams(max_new_tokens=4)
    return Sequence(name, [3] * prompt_len, params, lambda _: None, priority, arrival)


def test_a_waiting_prompt_that_could_not_be_admitted_does_not_cut_the_lane_short() -> None:
    """A paid stream holds most of the pool; a free prompt is on the lane. A paid prompt that
    would fit once the free one lets go outranks the lane's work; one too large even then (it may
    not preempt the paid stream) does not: ending the lane's work at each of its pieces got it
    admitted no sooner, and the free prompt's first token came up to twice as late. Before the fix
    both outranked it."""
    config = EngineConfig(block_size=4, num_blocks=20, max_num_seqs=8, max_num_batched_tokens=64)
    blocks = BlockManager(config.num_blocks, config.block_size)
    scheduler = Scheduler(config, blocks)
    stream, free = _seq("stream", 40, 2, 0), _seq("free", 24, 0, 1)  # 10 blocks, 6 blocks
    scheduler.add(stream)
    scheduler.add(free)
    chunks = scheduler.schedule()
    assert [c.seq for c in chunks] == [stream, free]
    scheduler.hold([free])  # the free prompt's chunk goes to the lane
    assert blocks.num_free_blocks == 4
    too_large = _seq("too large", 44, 1, 2)  # 11 blocks: 10 with the free prompt's 6 released
    scheduler.add(too_large)
    assert not scheduler.outranks_held()
    scheduler.remove(too_large)
    fits_after = _seq("fits after", 36, 1, 3)  # 9 blocks: 4 free, and the free prompt's 6
    scheduler.add(fits_after)
    assert scheduler.outranks_held()
    scheduler.remove(fits_after)
    fits_now = _seq("fits now", 12, 1, 4)
    scheduler.add(fits_now)
    assert scheduler.outranks_held()
    scheduler.remove(fits_now)
    same = _seq("same", 4, 0, 5)  # fits, but does not outrank the lane's prompt
    scheduler.add(same)
    assert not scheduler.outranks_held()
