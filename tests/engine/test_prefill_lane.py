"""The prefill lane (prefill_lane.py): a step's prefill chunks on a second thread beside its decodes."""

from __future__ import annotations

import threading
import time

from gpu_container.engine.arrays import Floats
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.prefill_lane import lane_wanted
from gpu_container.engine.types import EngineConfig, LaneSetting, SamplingParams
from tests.engine.collector import TIMEOUT_S, Collector
from tests.engine.failing_model import FailsOnToken
from tests.engine.tiny_llama import tiny_model

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
LONG_DECODE = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
PROMPT = [(7 * i) % 90 + 3 for i in range(40)]


def _engine(lane: LaneSetting, model: LlamaModel | None = None) -> LLMEngine:
    # 8 tokens a step: the 40-token prompt is prefilled over several steps, each beside decodes.
    config = EngineConfig(
        block_size=4, num_blocks=128, max_num_seqs=8, max_num_batched_tokens=8, prefill_lane=lane
    )
    return LLMEngine(model or tiny_model()[0], config, eos_token_ids=[1])


def _lane_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("llm-prefill-lane"))


def _join_while_decoding(engine: LLMEngine, seen: Collector, *prompts: tuple[str, list[int]]) -> None:
    """Two streams decoding, then the prompts arrive: their chunks share steps with the decodes."""
    engine.add_request("s0", [2, 3, 4], LONG_DECODE, seen)
    engine.add_request("s1", [5, 6], LONG_DECODE, seen)
    seen.wait_tokens("s0", 2)
    seen.wait_tokens("s1", 2)
    for request_id, prompt in prompts:
        engine.add_request(request_id, prompt, GREEDY, seen)
    seen.wait_finished("s0", "s1", *(request_id for request_id, _ in prompts))


def test_a_prompt_prefilled_on_the_lane_gets_the_tokens_one_forward_gives() -> None:
    outputs = {}
    lanes: tuple[LaneSetting, ...] = ("off", "on")
    for lane in lanes:
        before = _lane_threads()
        engine, seen = _engine(lane), Collector()
        engine.start()
        try:
            _join_while_decoding(engine, seen, ("long", PROMPT))
            # The lane's worker starts with its first chunk: on "on" it ran, on "off" it never did.
            assert _lane_threads() - before == (1 if lane == "on" else 0)
            outputs[lane] = {rid: seen.tokens(rid) for rid in ("s0", "s1", "long")}
            assert engine.stats().free_blocks == engine.stats().num_blocks
        finally:
            engine.stop()
        assert _lane_threads() == before  # stopping the engine ends its lane
    assert len(outputs["on"]["long"]) == GREEDY.max_new_tokens
    assert outputs["on"] == outputs["off"]


def test_a_chunk_failing_on_the_lane_errors_only_its_prompt() -> None:
    model, _ = tiny_model()
    engine, seen = _engine("on", FailsOnToken(model.config, model.weights)), Collector()
    engine.start()
    try:
        _join_while_decoding(engine, seen, ("bad", [66, *PROMPT[:20]]), ("good", PROMPT))
        assert seen.finish_reason("bad") == "error"
        assert "poisoned batch" in (seen.outputs["bad"][-1].error or "")
        assert seen.finish_reason("good") == seen.finish_reason("s0") == "length"
        engine.add_request("again", PROMPT, GREEDY, seen)
        seen.wait_finished("again")
        assert seen.tokens("again") == seen.tokens("good")
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        engine.stop()


def test_auto_takes_a_lane_only_with_one_blas_thread_and_two_cpus() -> None:
    assert not lane_wanted("off", 1)
    assert lane_wanted("on", 4)
    assert not lane_wanted("auto", 2)  # BLAS threads of its own would take the second core
    assert lane_wanted("auto", 1) == (len(__import__("os").sched_getaffinity(0)) >= 2)


class _GatedModel(LlamaModel):
    """The real model, except that the first forward of a prompt starting with token 77 waits for
    the test to open the gate: a lane chunk as long as the test wants."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__(model.config, model.weights)
        self.entered, self.gate = threading.Event(), threading.Event()

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        if not self.entered.is_set() and 77 in batch.token_ids[batch.positions == 0]:
            self.entered.set()
            assert self.gate.wait(TIMEOUT_S), "the test never opened the gate"
        return super().forward(batch, cache)


def test_decodes_go_on_while_the_lane_prefills_and_an_abort_there_waits_for_it() -> None:
    model = _GatedModel(tiny_model()[0])
    engine, seen = _engine("on", model), Collector()
    engine.start()
    try:
        engine.add_request(
            "s0", [2, 3, 4], SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True), seen
        )
        seen.wait_tokens("s0", 2)
        engine.add_request("gated", [77, *PROMPT], GREEDY, seen)
        assert model.entered.wait(TIMEOUT_S)
        before = len(seen.tokens("s0"))
        seen.wait_tokens("s0", before + 5)  # the stream decodes while the lane is stuck
        engine.abort("gated")
        seen.wait_tokens("s0", before + 10)
        # Not cancelled yet: the lane is still writing its blocks, which must not be freed under it.
        assert seen.finish_reason("gated") is None
        model.gate.set()
        seen.wait_finished("gated")
        assert seen.finish_reason("gated") == "cancelled"
        assert seen.tokens("gated") == []
        engine.abort("s0")
        seen.wait_finished("s0")
        assert engine.wait_until_idle(TIMEOUT_S)
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        model.gate.set()
        engine.stop()


def test_a_full_pool_preempts_around_a_prompt_on_the_lane() -> None:
    """16 blocks of 4 tokens. The prompt on the lane holds 11 of them; the stream beside it soon
    needs a block the pool lacks, and the worst running sequence not held is the stream itself: it
    gives its blocks back and waits, while the lane's blocks stay untouched. Both then end with the
    tokens each gets alone (preemption recomputes)."""
    params = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)
    alone = {}
    for request_id, prompt in (("s0", [2, 3, 4]), ("gated", [77, *PROMPT])):
        engine, seen = _engine("off"), Collector()
        engine.start()
        try:
            engine.add_request(request_id, prompt, params, seen)
            seen.wait_finished(request_id)
            alone[request_id] = seen.tokens(request_id)
        finally:
            engine.stop()
    model = _GatedModel(tiny_model()[0])
    config = EngineConfig(
        block_size=4, num_blocks=16, max_num_seqs=8, max_num_batched_tokens=64, prefill_lane="on"
    )
    engine, seen = LLMEngine(model, config, eos_token_ids=[1]), Collector()
    engine.start()
    try:
        engine.add_request("s0", [2, 3, 4], params, seen)
        seen.wait_tokens("s0", 2)
        engine.add_request("gated", [77, *PROMPT], params, seen)
        assert model.entered.wait(TIMEOUT_S)
        deadline = time.monotonic() + TIMEOUT_S
        while engine.stats().preemptions == 0:  # the stream runs out of blocks beside the lane
            assert time.monotonic() < deadline, "the stream never needed the lane's blocks"
            time.sleep(0.001)
        assert seen.finish_reason("s0") is None
        model.gate.set()
        seen.wait_finished("s0", "gated")
        for request_id, tokens in alone.items():
            assert seen.tokens(request_id) == tokens, request_id
        assert engine.stats().free_blocks == config.num_blocks
    finally:
        model.gate.set()
        engine.stop()
