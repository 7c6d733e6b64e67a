"""Random interleavings of adds, aborts and steps on a pool small enough to preempt, with the prefix
cache on: every request ends exactly once, the pool is whole again afterwards, and each reply is
the one its prompt gets alone (a cancelled one, the start of it).

The model lets the engine run one forward per go from the test, so an add or an abort lands between
two known steps: mid-prefill, between chunks, while preempted, at the step a reply ends. Through
the engine's public API only; the prefill lane is off (its forwards run beside the steps)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_container.engine.arrays import Floats
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.types import EngineConfig, SamplingParams, TokenOutput
from tests.engine.collector import TIMEOUT_S, tokens_alone
from tests.engine.tiny_llama import tiny_model

# 8 blocks of 4 tokens: a 32-token prompt fills the whole pool, and three streams soon preempt.
CONFIG = EngineConfig(
    block_size=4,
    num_blocks=8,
    max_num_seqs=3,
    max_num_batched_tokens=6,
    max_model_len=32,
    prefill_lane="off",
    gemv_knee_rows=1,
)
SHARED = [(11 * i) % 90 + 3 for i in range(32)]


class _Stepped(LlamaModel):
    """The tiny model, each forward waiting for a go from the test; it and the outputs share one
    condition, so the test can wait for the engine to be parked at its next forward, or idle."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__(model.config, model.weights)
        self.cond = threading.Condition()
        self.parked = False
        self.goes = 0
        self.outputs: dict[str, list[TokenOutput]] = {}
        self.live: set[str] = set()

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        with self.cond:
            self.parked = True
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: self.goes > 0, TIMEOUT_S), "the test never said go"
            self.goes -= 1
            self.parked = False
        return super().forward(batch, cache)

    def record(self, output: TokenOutput) -> None:
        with self.cond:
            self.outputs[output.request_id].append(output)
            if output.finish_reason is not None:
                self.live.discard(output.request_id)
            self.cond.notify_all()

    def settle(self, engine: LLMEngine) -> None:
        """Wait until the engine is parked at a forward (its inbox taken) or has nothing left."""
        with self.cond:
            settled = self.cond.wait_for(lambda: (self.parked and not self.goes) or not self.live, TIMEOUT_S)
            idle = not self.live
        assert settled, "the engine neither reached a forward nor finished"
        if idle:  # and done with the step that ended the last request, its ids forgotten
            assert engine.wait_until_idle(TIMEOUT_S)

    def step(self, engine: LLMEngine) -> None:
        """One forward, if anything is left (settled before: the engine is parked at it)."""
        with self.cond:
            if not self.live:
                return
            assert self.parked
            self.goes += 1
            self.cond.notify_all()
        self.settle(engine)


@dataclass(frozen=True)
class Add:
    shared: int  # tokens taken from SHARED, the rest from one of three tails
    tail: int
    length: int
    max_new: int
    priority: int
    seeded: bool


@dataclass(frozen=True)
class Abort:
    index: int  # of the requests added so far, modulo their count


@dataclass(frozen=True)
class Step:
    count: int


adds = st.builds(
    Add,
    shared=st.sampled_from([0, 4, 7, 16, 32]),
    tail=st.integers(0, 2),
    # Lengths at and around block edges often, so that equal prompts (a whole prompt in the
    # cache, its last block recomputed) and the pool's exact fill come up.
    length=st.one_of(st.sampled_from([1, 4, 5, 8, 9, 16, 17, 31, 32]), st.integers(1, 32)),
    max_new=st.integers(1, 24),
    priority=st.integers(0, 1),
    seeded=st.booleans(),
)
# Adds weigh twice: three or more requests at once are what run the pool dry and preempt.
ops = st.lists(
    st.one_of(
        adds, adds, st.builds(Abort, index=st.integers(0, 100)), st.builds(Step, count=st.integers(1, 6))
    ),
    min_size=3,
    max_size=30,
)


@cache
def _model() -> LlamaModel:
    return tiny_model()[0]


@cache
def _alone(prompt: tuple[int, ...], params: SamplingParams) -> list[int]:
    return tokens_alone(_model(), CONFIG, list(prompt), params)


def _request(add: Add) -> tuple[list[int], SamplingParams]:
    tail = [(add.tail * 29 + i * 13) % 90 + 3 for i in range(add.length)]
    prompt = SHARED[: min(add.shared, add.length)] + tail[min(add.shared, add.length) :]
    params = SamplingParams(
        max_new_tokens=add.max_new,
        temperature=0.8 if add.seeded else 0.0,
        seed=add.tail if add.seeded else None,
        ignore_eos=True,
    )
    return prompt, params


@settings(max_examples=150, deadline=None)
@given(script=ops)
def test_any_interleaving_of_adds_aborts_and_steps_leaves_the_pool_whole_and_replies_as_alone(
    script: list[Add | Abort | Step],
) -> None:
    model = _Stepped(_model())
    engine = LLMEngine(model, CONFIG, eos_token_ids=[1])
    requests: dict[str, tuple[list[int], SamplingParams]] = {}
    engine.start()
    try:
        for op in script:
            if isinstance(op, Add):
                rid = f"r{len(requests)}"
                requests[rid] = _request(op)
                with model.cond:
                    model.outputs[rid] = []
                    model.live.add(rid)
                engine.add_request(rid, *requests[rid], model.record, priority=op.priority)
            elif isinstance(op, Abort) and requests:
                engine.abort(f"r{op.index % len(requests)}")
            elif isinstance(op, Step):
                for _ in range(op.count):
                    model.step(engine)
                    assert 0 <= engine.stats().free_blocks <= CONFIG.num_blocks
            model.settle(engine)
        while model.live:
            model.step(engine)
        assert engine.wait_until_idle(TIMEOUT_S)
        stats = engine.stats()
    finally:
        with model.cond:
            model.goes = 1_000_000  # whatever is left runs through, so stop() can cancel it
            model.cond.notify_all()
        engine.stop()
    assert stats.free_blocks == CONFIG.num_blocks and stats.running == stats.waiting == 0
    for rid, (prompt, params) in requests.items():
        outputs = model.outputs[rid]
        reasons = [o.finish_reason for o in outputs]
        assert reasons[-1] is not None and reasons.count(None) == len(reasons) - 1, rid
        tokens = [t for o in outputs for t in o.token_ids]
        alone = _alone(tuple(prompt), params)
        if reasons[-1] == "cancelled":
            assert tokens == alone[: len(tokens)], rid
        else:
            # No stop token and eos ignored: max_new_tokens, or as many as fill the context (one
            # after a prompt that fills it already).
            room = max(1, CONFIG.max_model_len - len(prompt))
            assert len(tokens) == min(params.max_new_tokens, room), rid
            assert (tokens, reasons[-1]) == (alone, "length"), rid
