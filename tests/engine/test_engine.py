"""LLMEngine through its public, thread-safe API, running its own loop thread."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest

from gpu_container.engine.arrays import Floats
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.scheduler import ScheduledChunk
from gpu_container.engine.types import EngineConfig, SamplingParams, TokenOutput
from tests.engine.collector import TIMEOUT_S, Collector
from tests.engine.failing_model import FailsOnToken
from tests.engine.tiny_llama import tiny_model

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


ENGINE_CONFIG = EngineConfig(block_size=4, num_blocks=32, max_num_seqs=8, max_num_batched_tokens=16)


def _engine(model: LlamaModel | None = None, **overrides: int | str) -> LLMEngine:
    config = msgspec.structs.replace(ENGINE_CONFIG, **overrides)
    return LLMEngine(model or tiny_model()[0], config, eos_token_ids=[1])


@pytest.fixture
def engine() -> Iterator[LLMEngine]:
    engine = _engine()
    engine.start()
    yield engine
    engine.stop()


def test_greedy_is_deterministic_whatever_it_is_batched_with(engine: LLMEngine) -> None:
    seen = Collector()
    prompt = [5, 9, 13, 2, 7]
    engine.add_request("alone", prompt, GREEDY, seen)
    seen.wait_finished("alone")
    for i in range(5):
        engine.add_request(f"crowd{i}", [3 + i] * (2 + 3 * i), GREEDY, seen)
    engine.add_request("batched", prompt, GREEDY, seen)
    seen.wait_finished("batched", *(f"crowd{i}" for i in range(5)))
    assert len(seen.tokens("alone")) == 8
    assert seen.tokens("batched") == seen.tokens("alone")


def test_seeded_sampling_is_reproducible(engine: LLMEngine) -> None:
    seen = Collector()
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    engine.add_request("first", [4, 8, 15], params, seen)
    seen.wait_finished("first")
    engine.add_request("noise", [16, 23, 42] * 3, SamplingParams(max_new_tokens=16, seed=99), seen)
    engine.add_request("second", [4, 8, 15], params, seen)
    engine.add_request("other-seed", [4, 8, 15], dataclasses.replace(params, seed=4321), seen)
    seen.wait_finished("second", "noise", "other-seed")
    assert len(seen.tokens("first")) == 16
    assert seen.tokens("second") == seen.tokens("first")
    assert seen.tokens("other-seed") != seen.tokens("first")


def test_waiting_requests_run_by_priority_then_arrival() -> None:
    engine = _engine(max_num_seqs=1)
    seen = Collector()
    order: list[str] = []

    def record(output: TokenOutput) -> None:
        seen(output)
        if output.finish_reason is not None:
            order.append(output.request_id)

    for arrival, priority in enumerate([0, 10, 0, 5, 10]):
        engine.add_request(f"p{priority}-a{arrival}", [2, 3], GREEDY, record, priority=priority)
    engine.start()
    try:
        assert engine.wait_until_idle(TIMEOUT_S)
    finally:
        engine.stop()
    assert order == ["p10-a1", "p10-a4", "p5-a3", "p0-a0", "p0-a2"]


def test_abort_mid_decode_frees_blocks_at_once(engine: LLMEngine) -> None:
    seen = Collector()
    long = SamplingParams(max_new_tokens=100_000, temperature=0.0, ignore_eos=True)
    engine.add_request("long", [6] * 9, long, seen)
    seen.wait_tokens("long", 3)
    assert engine.stats().free_blocks < engine.stats().num_blocks
    engine.abort("long")
    seen.wait_finished("long")
    stats = engine.stats()  # published before the final callback
    assert seen.finish_reason("long") == "cancelled"
    assert stats.free_blocks == stats.num_blocks and stats.running == 0 and stats.waiting == 0
    engine.abort("long")  # idempotent, and unknown ids are a no-op
    engine.abort("never-seen")


def test_stop_token_is_emitted_and_length_limits_apply(engine: LLMEngine) -> None:
    seen = Collector()
    engine.add_request("probe", [11, 12], GREEDY, seen)
    seen.wait_finished("probe")
    third = seen.tokens("probe")[2]
    stop_on_third = SamplingParams(
        max_new_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=(third,)
    )
    engine.add_request("stops", [11, 12], stop_on_third, seen)
    seen.wait_finished("stops")
    tokens = seen.tokens("stops")
    assert tokens[-1] == third and len(tokens) <= 3
    assert seen.finish_reason("stops") == "stop"
    assert seen.finish_reason("probe") == "length"


def test_min_tokens_holds_the_models_end_token_back(engine: LLMEngine) -> None:
    seen = Collector()
    engine.add_request("probe", [11, 12], GREEDY, seen)
    seen.wait_finished("probe")
    first = seen.tokens("probe")[0]
    # An engine whose model ends on that token: the reply is that token alone, unless held back.
    ending = LLMEngine(tiny_model()[0], ENGINE_CONFIG, eos_token_ids=[first])
    ending.start()
    try:
        plain = SamplingParams(max_new_tokens=8, temperature=0.0)
        ending.add_request("plain", [11, 12], plain, seen)
        ending.add_request("held", [11, 12], dataclasses.replace(plain, min_tokens=5), seen)
        seen.wait_finished("plain", "held")
    finally:
        ending.stop()
    assert seen.tokens("plain") == [first] and seen.finish_reason("plain") == "stop"
    held = seen.tokens("held")
    assert len(held) > 5 and first not in held[:5]  # the engine's own eos, not a stop_token_id


def test_max_model_len_ends_with_length() -> None:
    engine = _engine(max_model_len=10)
    engine.start()
    seen = Collector()
    try:
        engine.add_request(
            "r", [3] * 7, SamplingParams(max_new_tokens=50, temperature=0, ignore_eos=True), seen
        )
        seen.wait_finished("r")
    finally:
        engine.stop()
    assert len(seen.tokens("r")) == 3 and seen.finish_reason("r") == "length"


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=float("nan"), top_p=0.9),
        # -inf / inf where min_tokens holds a token back: every token drawn was the row's last.
        SamplingParams(temperature=float("inf"), min_tokens=2, stop_token_ids=(7,)),
        SamplingParams(temperature=0.0, repetition_penalty=float("nan")),
        SamplingParams(temperature=0.0, repetition_penalty=float("inf")),
        SamplingParams(temperature=0.0, presence_penalty=float("nan")),
        SamplingParams(temperature=0.0, frequency_penalty=float("-inf")),
        SamplingParams(temperature=0.0, logit_bias=((5, float("nan")),)),
        SamplingParams(temperature=1.0, logit_bias=((5, float("inf")),)),
    ],
    ids=[
        "nan-temperature",
        "inf-temperature",
        "nan-repetition",
        "inf-repetition",
        "nan-presence",
        "inf-frequency",
        "nan-bias",
        "inf-bias",
    ],
)
def test_a_sampling_setting_that_is_not_a_finite_number_is_refused(
    engine: LLMEngine, params: SamplingParams
) -> None:
    # The Triton model reads these from float tensors, where nothing bounds them as the edge does:
    # past this check, a NaN made the sampler fail mid-reply (an "error" the caller cannot tell from
    # a broken replica's) or pick nonsense tokens with no error at all.
    with pytest.raises(ValueError, match="finite"):
        engine.add_request("x", [2, 3], dataclasses.replace(params, max_new_tokens=4), Collector())


def test_invalid_requests_are_refused(engine: LLMEngine) -> None:
    seen = Collector()
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("a", [], GREEDY, seen)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("b", [1] * 3000, GREEDY, seen)
    with pytest.raises(ValueError, match="holds at most"):
        engine.add_request("c", [1] * 129, GREEDY, seen)  # 32 blocks of 4 tokens
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("d", [10_000], GREEDY, seen)
    for token in (-1, engine.vocab_size):  # a bias the sampler's row has no place for
        with pytest.raises(ValueError, match="logit_bias"):
            engine.add_request("d", [1], SamplingParams(logit_bias=((token, 1.0),)), seen)
    for token in (-1, engine.vocab_size):  # a stop token min_tokens could not hold back in the row
        with pytest.raises(ValueError, match="stop_token_ids"):
            engine.add_request("d", [1], SamplingParams(stop_token_ids=(token,)), seen)
        with pytest.raises(ValueError, match="stop_token_ids"):
            engine.add_request("d", [1], SamplingParams(min_tokens=1, min_tokens_ids=(token,)), seen)
    with pytest.raises(ValueError, match="min_tokens"):
        engine.add_request("d", [1], SamplingParams(min_tokens=-1), seen)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.add_request("e", [1], SamplingParams(max_new_tokens=0), seen)
    engine.add_request("f", [2, 3], SamplingParams(max_new_tokens=1000, ignore_eos=True), seen)
    with pytest.raises(ValueError, match="already"):
        engine.add_request("f", [2, 3], GREEDY, seen)


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_a_failing_step_errors_only_the_culprit_and_the_engine_lives_on(batching: str) -> None:
    """Static batching too: the culprit, finished once, must not stay in its batch as padding (it
    would fail again, and be finished again, every step)."""
    model, _ = tiny_model()
    engine = _engine(FailsOnToken(model.config, model.weights), batching=batching)
    seen = Collector()
    # Queued before start, so all three share the first step's batch.
    engine.add_request("good1", [2, 3], GREEDY, seen)
    engine.add_request("bad", [66, 2, 3], GREEDY, seen)
    engine.add_request("good2", [4, 5, 6], GREEDY, seen)
    engine.start()
    try:
        seen.wait_finished("bad", "good1", "good2")
        assert seen.finish_reason("bad") == "error"
        assert [o.finish_reason for o in seen.outputs["bad"] if o.finish_reason] == ["error"]
        assert "poisoned batch" in (seen.outputs["bad"][-1].error or "")
        assert seen.finish_reason("good1") == seen.finish_reason("good2") == "length"
        assert len(seen.tokens("good1")) == len(seen.tokens("good2")) == 8
        engine.add_request("later", [2, 3], GREEDY, seen)
        seen.wait_finished("later")
        assert seen.tokens("later") == seen.tokens("good1")
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        engine.stop()


class _FailsOnPadding(LlamaModel):
    """The real model, except that a batch holding token 0 raises: static batching feeds its
    padding (members finished before the rest of their batch) that placeholder."""

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        if 0 in batch.token_ids:
            raise FloatingPointError("bad row")
        return super().forward(batch, cache)


def test_static_padding_whose_own_retry_fails_is_not_finished_again() -> None:
    """A failed step's sequences are retried one by one; a padding member whose own retry failed
    was finished a second time (a review): its client got "error" after its "length", and the
    second removal of its id raised out of the engine's loop, which died with every other stream
    waiting."""
    model, _ = tiny_model()
    engine = _engine(_FailsOnPadding(model.config, model.weights), batching="static")
    seen = Collector()
    engine.add_request("short", [5, 6, 7], dataclasses.replace(GREEDY, max_new_tokens=1), seen)
    engine.add_request("long", [8, 9, 10], dataclasses.replace(GREEDY, max_new_tokens=6), seen)
    engine.start()
    try:
        seen.wait_finished("short", "long")
        assert [o.finish_reason for o in seen.outputs["short"] if o.finish_reason] == ["length"]
        assert seen.finish_reason("long") in ("length", "error")
        engine.add_request("later", [2, 3], GREEDY, seen)  # the engine still serves
        seen.wait_finished("later")
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        engine.stop()


def test_a_bookkeeping_failure_fails_everything_and_resets_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the failed state held fails; a request added while the failing step ran waited in the
    inbox and never touched that state: it runs on the fresh pool, with one final output (before,
    it was failed too, then run all the same, and its finish killed the loop thread)."""
    engine = _engine()
    seen = Collector()
    forever = SamplingParams(max_new_tokens=100_000, temperature=0, ignore_eos=True)
    engine.start()
    try:
        engine.add_request("victim", [2, 3], forever, seen)
        seen.wait_tokens("victim", 1)

        def broken() -> list[ScheduledChunk]:
            engine.add_request("late", [2, 3], GREEDY, seen)  # another thread's, as the step runs
            raise AssertionError("scheduler bug")

        monkeypatch.setattr(engine._scheduler, "schedule", broken)
        seen.wait_finished("victim", "late")
        assert seen.finish_reason("victim") == "error"
        assert "scheduler bug" in (seen.outputs["victim"][-1].error or "")
        finals = [o.finish_reason for o in seen.outputs["late"] if o.finish_reason is not None]
        assert finals == ["length"]
        engine.add_request("after", [2, 3], GREEDY, seen)
        seen.wait_finished("after")
        assert seen.finish_reason("after") == "length"
        assert engine.wait_until_idle(TIMEOUT_S)
        assert engine.stats().free_blocks == engine.stats().num_blocks
    finally:
        engine.stop()


def test_stop_cancels_everything_and_is_idempotent() -> None:
    engine = _engine()
    seen = Collector()
    forever = SamplingParams(max_new_tokens=100_000, temperature=0, ignore_eos=True)
    engine.add_request("queued-before-start", [2], forever, seen)
    engine.start()
    engine.add_request("running", [3, 4], forever, seen)
    seen.wait_tokens("running", 2)
    engine.stop()
    engine.stop()
    assert seen.finish_reason("running") == "cancelled"
    assert seen.finish_reason("queued-before-start") == "cancelled"
    assert engine.stats().free_blocks == engine.stats().num_blocks
    with pytest.raises(RuntimeError):
        engine.add_request("late", [2], GREEDY, seen)


def test_thousands_of_random_requests_and_aborts_leave_nothing_behind() -> None:
    # A pool of 10 blocks x 4 tokens forces preemption; aborts come from this thread and from callbacks.
    engine = _engine(num_blocks=10, max_num_seqs=8, max_num_batched_tokens=16, max_model_len=40)
    rng = np.random.default_rng(11)
    seen = Collector()
    abort_from_callback = {f"r{i}" for i in range(0, 2000, 7)}

    def on_output(output: TokenOutput) -> None:
        seen(output)
        if output.request_id in abort_from_callback:
            engine.abort(output.request_id)

    engine.start()
    try:
        limits = {}
        for i in range(2000):
            limits[f"r{i}"] = int(rng.integers(1, 7))
            prompt = rng.integers(2, 90, int(rng.integers(1, 16))).tolist()
            params = SamplingParams(max_new_tokens=limits[f"r{i}"], temperature=float(rng.choice([0.0, 1.0])))
            engine.add_request(f"r{i}", prompt, params, on_output, priority=int(rng.integers(0, 3)))
            if rng.random() < 0.2:
                engine.abort(f"r{int(rng.integers(0, i + 1))}")
        assert engine.wait_until_idle(TIMEOUT_S)
        stats = engine.stats()
    finally:
        engine.stop()
    assert stats.free_blocks == stats.num_blocks and stats.running == 0 and stats.waiting == 0
    assert stats.preemptions > 0
    reasons = {rid: [o.finish_reason for o in outs] for rid, outs in seen.outputs.items()}
    assert set(reasons) == set(limits)
    for rid, finals in reasons.items():
        assert finals[-1] is not None and finals.count(None) == len(finals) - 1, rid
        assert len(seen.tokens(rid)) <= limits[rid]
    counted = {r: sum(1 for f in reasons.values() if f[-1] == r) for r in ("cancelled", "length", "stop")}
    assert counted["cancelled"] > 100 and counted["length"] > 100
