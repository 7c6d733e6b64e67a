"""A prompt that outranks the prefill lane's waits for a piece of the lane's chunk, not all of it
(prefill_lane.py): paid traffic is not kept behind a free prompt's large chunk."""

from __future__ import annotations

import threading

from msgspec.structs import replace

from gpu_container.engine.arrays import Floats
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.types import EngineConfig, LaneSetting, SamplingParams, TokenOutput
from tests.engine.collector import TIMEOUT_S, Collector, tokens_alone
from tests.engine.tiny_llama import tiny_model

GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
STREAM = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)
# 400 tokens: one chunk of the lane's 512-token step, a piece of 256 and one of 144.
FREE = [77, *((5 * i) % 90 + 3 for i in range(399))]
PAID = [(3 * i) % 90 + 4 for i in range(20)]


class _GatedModel(LlamaModel):
    """The tiny model, except that the forward holding the free prompt's first token waits for the
    test to open the gate; from that one on, it records the rows of each forward of prompts."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__(model.config, model.weights)
        self.entered, self.gate = threading.Event(), threading.Event()
        self.prefill_rows: list[int] = []

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        if 77 in batch.token_ids[batch.positions == 0]:
            self.entered.set()
            assert self.gate.wait(TIMEOUT_S), "the test never opened the gate"
        if self.entered.is_set() and len(batch.token_ids) > 1:
            self.prefill_rows.append(len(batch.token_ids))
        return super().forward(batch, cache)


class _Ordered(Collector):
    """A collector that also keeps the order in which requests got their first token."""

    def __init__(self) -> None:
        super().__init__()
        self.first_tokens: list[str] = []

    def __call__(self, output: TokenOutput) -> None:
        if output.token_ids and not self.tokens(output.request_id):
            self.first_tokens.append(output.request_id)
        super().__call__(output)


def _config(lane: LaneSetting) -> EngineConfig:
    """A step of 512 tokens, the lane's pieces of 256 (the defaults)."""
    return EngineConfig(
        block_size=4,
        num_blocks=256,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=512,
        prefill_lane=lane,
    )


def _alone(prompt: list[int]) -> list[int]:
    return tokens_alone(tiny_model()[0], _config("off"), prompt, GREEDY)


def test_a_paid_prompt_gets_its_first_token_before_the_lane_ends_a_free_prompts_chunk() -> None:
    """A stream decodes; a free 400-token prompt goes to the lane as one chunk, whose first piece
    waits at a gate; a paid prompt arrives and the engine steps on (the stream's tokens). Once the
    gate opens the lane ends its work after that piece, the paid prompt is prefilled next and gets
    its first token before the free prompt's last 144 tokens are computed. Before the pieces the
    lane computed the whole chunk first: the free prompt's first token came first."""
    model = _GatedModel(tiny_model()[0])
    engine, seen = LLMEngine(model, _config("on"), eos_token_ids=[1]), _Ordered()
    engine.start()
    try:
        engine.add_request("stream", [2, 3, 4], STREAM, seen, priority=0)
        seen.wait_tokens("stream", 2)
        engine.add_request("free", FREE, GREEDY, seen, priority=0)
        assert model.entered.wait(TIMEOUT_S)
        engine.add_request("paid", PAID, GREEDY, seen, priority=1)
        decoded = len(seen.tokens("stream"))
        seen.wait_tokens("stream", decoded + 3)  # the engine has stepped since the paid prompt came
        model.gate.set()
        seen.wait_finished("paid", "free")
        assert seen.first_tokens[1:] == ["paid", "free"]
        assert model.prefill_rows[:2] == [256, len(PAID)]  # one piece, then the paid prompt
        # Committed as far as the lane got, the free prompt's prefill gives what one forward does.
        assert seen.tokens("free") == _alone(FREE)
        assert seen.tokens("paid") == _alone(PAID)
        engine.abort("stream")
        assert engine.wait_until_idle(TIMEOUT_S)
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        model.gate.set()
        engine.stop()


def test_an_abort_of_the_lanes_prompt_ends_its_work_at_the_next_piece() -> None:
    model = _GatedModel(tiny_model()[0])
    engine, seen = LLMEngine(model, _config("on"), eos_token_ids=[1]), Collector()
    engine.start()
    try:
        engine.add_request("stream", [2, 3, 4], STREAM, seen)
        seen.wait_tokens("stream", 2)
        engine.add_request("free", FREE, GREEDY, seen)
        assert model.entered.wait(TIMEOUT_S)
        engine.abort("free")
        decoded = len(seen.tokens("stream"))
        seen.wait_tokens("stream", decoded + 3)  # the engine has stepped since the abort
        model.gate.set()
        seen.wait_finished("free")
        assert seen.finish_reason("free") == "cancelled"
        assert model.prefill_rows == [256]
        engine.abort("stream")
        assert engine.wait_until_idle(TIMEOUT_S)
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        model.gate.set()
        engine.stop()


def test_pieces_give_the_tokens_one_forward_gives() -> None:
    """Chunks of 40 tokens and more beside two streams, computed 3 rows at a time."""
    outputs = {}
    runs: tuple[tuple[LaneSetting, int], ...] = (("off", 512), ("on", 3))
    for lane, pieces in runs:
        config = replace(_config(lane), lane_piece_tokens=pieces)
        engine = LLMEngine(tiny_model()[0], config, eos_token_ids=[1])
        seen = Collector()
        engine.start()
        try:
            engine.add_request("s0", [2, 3, 4], GREEDY, seen)
            engine.add_request("s1", [5, 6], GREEDY, seen)
            seen.wait_tokens("s0", 1)
            engine.add_request("long", FREE[1:60], GREEDY, seen)
            engine.add_request("short", PAID, GREEDY, seen, priority=1)
            seen.wait_finished("s0", "s1", "long", "short")
            outputs[lane] = {rid: seen.tokens(rid) for rid in ("s0", "s1", "long", "short")}
        finally:
            engine.stop()
    assert outputs["on"] == outputs["off"]
