"""The sampler's distribution: greedy, temperature, the top-k and top-p cuts, the penalties, the bias
and min_tokens' hold on the end tokens."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpu_container.engine.sampler import nucleus, sample
from gpu_container.engine.types import SamplingParams

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))


def _frequencies(params: SamplingParams, draws: int = 10_000) -> npt.NDArray[np.float64]:
    rng = np.random.default_rng(0)
    counts = np.bincount([sample(LOGITS, params, rng) for _ in range(draws)], minlength=len(LOGITS))
    return counts / draws


def test_greedy_takes_the_argmax() -> None:
    assert sample(LOGITS, SamplingParams(temperature=0), np.random.default_rng(0)) == 0
    assert sample(LOGITS[::-1].copy(), SamplingParams(temperature=0), None) == 3


def test_temperature_one_follows_the_softmax() -> None:
    np.testing.assert_allclose(
        _frequencies(SamplingParams(temperature=1.0)), [0.5, 0.3, 0.15, 0.05], atol=0.02
    )


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    # 0.5 + 0.3 = 0.8 >= 0.7: only the first two tokens survive, renormalised to 5/8 and 3/8.
    np.testing.assert_allclose(
        _frequencies(SamplingParams(temperature=1.0, top_p=0.7)), [0.625, 0.375, 0, 0], atol=0.02
    )


def test_top_k_keeps_the_k_most_likely() -> None:
    # The first two tokens survive, renormalised to 5/8 and 3/8; top_p then cuts within them.
    np.testing.assert_allclose(
        _frequencies(SamplingParams(temperature=1.0, top_k=2)), [0.625, 0.375, 0, 0], atol=0.02
    )
    np.testing.assert_allclose(
        _frequencies(SamplingParams(temperature=1.0, top_k=3, top_p=0.5)), [1, 0, 0, 0], atol=0.001
    )
    assert _frequencies(SamplingParams(temperature=2.0, top_k=1))[0] == 1.0  # greedy, as on TensorRT-LLM


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = np.array([3.0, 2.0, -1.0, 1.0], dtype=np.float32)
    # Token 0 (prompt) 3 -> 1.5, token 1 untouched: greedy moves to 1.
    assert sample(logits, SamplingParams(temperature=0, repetition_penalty=2.0), None, [], [0]) == 1
    # Seen in the reply counts as in the prompt (3 -> 0.75, 2 -> 0.5 against token 3's 1.0).
    assert sample(logits, SamplingParams(temperature=0, repetition_penalty=4.0), None, [0, 1], [2]) == 3
    assert sample(logits, SamplingParams(temperature=0), None, [0, 1], [2]) == 0  # off: unchanged
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0)
    draws = np.bincount([sample(logits, params, rng, [], [2]) for _ in range(10_000)], minlength=4)
    # exp(-2) for token 2 against exp(-1) unpenalised.
    expected = np.exp([3.0, 2.0, -2.0, 1.0]) / np.exp([3.0, 2.0, -2.0, 1.0]).sum()
    np.testing.assert_allclose(draws / 10_000, expected, atol=0.02)


def test_logit_bias_is_added_before_the_repetition_penalty_divides() -> None:
    """(logit + bias) / penalty, as vLLM and TensorRT-LLM score a biased token the prompt holds: here
    (10 + 4) / 2 = 7 < 8, so token 1; bias after the penalty would give 10 / 2 + 4 = 9 > 8."""
    logits = np.array([10.0, 8.0], dtype=np.float32)
    params = SamplingParams(temperature=0, repetition_penalty=2.0, logit_bias=((0, 4.0),))
    assert sample(logits, params, None, [], [0]) == 1


def test_a_repetition_penalty_near_zero_ties_the_penalised_tokens_instead_of_failing() -> None:
    # 5 / 1.2e-38 is past float32's range: +inf, and inf - inf made the row NaN (an IndexError at
    # top_p below 1, a 502 for the request). Now the tokens so penalised tie at float32's largest.
    logits = np.array([3.0, 5.0, -1.0, 6.0], dtype=np.float32)
    tiny = SamplingParams(temperature=0, repetition_penalty=1.2e-38)
    assert sample(logits, tiny, None, [], [1, 3]) == 1  # the first of the tied tokens
    rng = np.random.default_rng(0)
    for top_p in (0.9, 1.0):
        params = SamplingParams(temperature=1.0, top_p=top_p, repetition_penalty=1.2e-38)
        draws = np.bincount([sample(logits, params, rng, [], [1, 3]) for _ in range(2_000)], minlength=4)
        assert draws[0] == draws[2] == 0 and min(draws[1], draws[3]) > 800, (top_p, draws)


def test_low_temperature_sharpens() -> None:
    assert _frequencies(SamplingParams(temperature=0.2))[0] > 0.9


def test_presence_penalty_takes_the_same_off_every_token_the_reply_has() -> None:
    logits = np.array([3.0, 2.9, 0.0], dtype=np.float32)
    greedy = SamplingParams(temperature=0, presence_penalty=0.5)
    assert sample(logits, greedy, None, [0]) == 1
    assert sample(logits, greedy, None, [0, 0, 0, 1]) == 0  # both penalised once: 2.5 > 2.4
    assert sample(logits, greedy, None, []) == 0  # nothing generated yet: nothing to penalise
    assert logits[0] == 3.0  # the batch's row itself is left as it was


def test_frequency_penalty_counts_how_often() -> None:
    logits = np.array([3.0, 2.9, 0.0], dtype=np.float32)
    once_too_often = SamplingParams(temperature=0, frequency_penalty=0.05)
    assert sample(logits, once_too_often, None, [0]) == 0  # 2.95 > 2.9
    assert sample(logits, once_too_often, None, [0, 0, 0]) == 1  # 2.85 < 2.9
    # A negative penalty favours what was said: the third token overtakes both.
    assert sample(logits, SamplingParams(temperature=0, frequency_penalty=-2.0), None, [2, 2]) == 2


def test_penalties_shift_the_sampled_distribution_too() -> None:
    params = SamplingParams(temperature=1.0, presence_penalty=2.0)
    rng = np.random.default_rng(0)
    draws = np.bincount([sample(LOGITS, params, rng, [0]) for _ in range(10_000)], minlength=len(LOGITS))
    # exp(-2) on token 0: 0.5e^-2 / (0.5e^-2 + 0.5) = 0.119
    np.testing.assert_allclose(draws[0] / 10_000, 0.5 * np.exp(-2) / (0.5 * np.exp(-2) + 0.5), atol=0.02)


def test_logit_bias_plus_100_forces_a_token_greedy_too() -> None:
    forced = SamplingParams(temperature=0, logit_bias=((3, 100.0),))
    assert sample(LOGITS, forced, None) == 3  # the least likely token, over the argmax
    rng = np.random.default_rng(0)
    assert {
        sample(LOGITS, SamplingParams(temperature=1.0, logit_bias=((3, 100.0),)), rng) for _ in range(1000)
    } == {3}
    assert LOGITS[3] == np.float32(np.log(0.05))  # the batch's row itself is left as it was


def test_logit_bias_minus_100_bans_a_token() -> None:
    banned = SamplingParams(temperature=0, logit_bias=((0, -100.0),))
    assert sample(LOGITS, banned, None) == 1  # the runner-up once the argmax is banned
    rng = np.random.default_rng(0)
    draws = [
        sample(LOGITS, SamplingParams(temperature=1.0, logit_bias=((0, -100.0),)), rng) for _ in range(10_000)
    ]
    assert 0 not in draws
    # What token 0 held goes to the rest in proportion: 0.3 / 0.5 = 0.6 for token 1.
    assert abs(draws.count(1) / 10_000 - 0.6) < 0.02


def test_a_small_logit_bias_shifts_the_distribution_and_adds_to_the_penalties() -> None:
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0, logit_bias=((3, float(np.log(10.0))),))
    draws = np.bincount([sample(LOGITS, params, rng) for _ in range(10_000)], minlength=len(LOGITS))
    # x10 on token 3: 0.5 / (0.5 + 0.3 + 0.15 + 0.5) = 0.345 each for tokens 0 and 3.
    np.testing.assert_allclose(draws[[0, 3]] / 10_000, [0.5 / 1.45, 0.5 / 1.45], atol=0.02)
    # Greedy: 3.0 + 0.5 - 1.0 (presence, once generated) = 2.5 < 2.9.
    logits = np.array([3.0, 2.9, 0.0], dtype=np.float32)
    both = SamplingParams(temperature=0, presence_penalty=1.0, logit_bias=((0, 0.5),))
    assert sample(logits, both, None, [0]) == 1
    assert sample(logits, both, None, []) == 0


def test_min_tokens_holds_the_end_and_stop_tokens_back_until_the_reply_has_them() -> None:
    eos = (0,)  # the argmax is the model's end token; token 1 a stop token
    held = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(1,))
    assert sample(LOGITS, held, None, [], eos=eos) == 2  # greedy: both held back
    assert sample(LOGITS, held, None, [3], eos=eos) == 2
    assert sample(LOGITS, held, None, [3, 3], eos=eos) == 0  # two tokens: the end may come
    # -inf, not a penalty: a +100 bias cannot bring the end token back before its time.
    forced = SamplingParams(temperature=0, min_tokens=1, logit_bias=((0, 100.0),))
    assert sample(LOGITS, forced, None, [], eos=eos) == 1
    # With ignore_eos the model's end token ends nothing, so nothing holds it back.
    assert (
        sample(LOGITS, SamplingParams(temperature=0, min_tokens=2, ignore_eos=True), None, [], eos=eos) == 0
    )
    # Named ids (TensorRT-LLM's min_length holds back its end_id alone): the stop token may come.
    end_id_only = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(1,), min_tokens_ids=(0,))
    assert sample(LOGITS, end_id_only, None, [], eos=eos) == 1
    assert LOGITS[0] == np.float32(np.log(0.5))  # the batch's row itself is left as it was


def test_min_tokens_holds_the_end_token_back_when_sampling_too() -> None:
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0, min_tokens=1)
    draws = [sample(LOGITS, params, rng, [], eos=(0,)) for _ in range(10_000)]
    assert 0 not in draws
    # What token 0 held goes to the rest in proportion: 0.3 / 0.5 = 0.6 for token 1.
    assert abs(draws.count(1) / 10_000 - 0.6) < 0.02
    # Once the reply has min_tokens tokens the end token is drawn as often as ever.
    after = [sample(LOGITS, params, rng, [3], eos=(0,)) for _ in range(10_000)]
    assert abs(after.count(0) / 10_000 - 0.5) < 0.02


VOCAB = 49_152  # SmolLM2's


def _rows() -> list[npt.NDArray[np.float64]]:
    """Unnormalised probability rows as the sampler builds them: peaked, flat, tied at the cut, cut
    by top_k (zeros), and underflowed (a low temperature over a wide spread of logits)."""
    gen = np.random.default_rng(3)
    rows = []
    for temperature in (0.2, 1.0, 3.0):
        logits = gen.normal(0, 4, VOCAB)
        rows.append(np.exp((logits - logits.max()) / temperature))
    tied = np.full(VOCAB, 1e-6)
    tied[gen.choice(VOCAB, 300, replace=False)] = 1.0
    rows.append(tied)
    cut = np.exp(gen.normal(0, 1, VOCAB))
    cut[np.argsort(cut)[:-20]] = 0.0
    rows.append(cut)
    underflowed = np.exp(np.minimum(0.0, gen.normal(-900, 400, VOCAB)))
    underflowed[gen.choice(VOCAB, 5, replace=False)] = 1.0
    rows.append(underflowed)
    return rows


def test_a_nucleus_reaching_far_below_the_most_likely_token_keeps_the_right_tokens() -> None:
    # One token holds a fifth of the weight; a long tail of tokens, each 10,000 times less likely,
    # the rest. top_p 0.5 keeps the top token and the ~15,000 most likely of the tail, far below
    # where the nucleus looks first.
    gen = np.random.default_rng(1)
    tail = gen.permutation(VOCAB)[:40_000]
    weights = np.zeros(VOCAB)
    weights[tail] = 1e-4 * (1 - np.arange(40_000) * 1e-6)
    weights[tail[0]] = 1.0
    reached = np.searchsorted(np.cumsum(weights[tail]), 0.5 * weights.sum()) + 1
    rng = np.random.default_rng(0)
    drawn = [nucleus(weights, 0.5, rng) for _ in range(300)]
    assert set(drawn) <= set(tail[:reached].tolist())
    assert 12_000 < reached < 18_000 and len(set(drawn)) > 150


def test_the_nucleus_draws_what_a_sort_of_the_whole_row_draws() -> None:
    for top_p in (0.1, 0.5, 0.9, 0.99):
        for row in _rows():
            for seed in range(20):
                partial = nucleus(row, top_p, np.random.default_rng(seed))
                whole = nucleus(row, top_p, np.random.default_rng(seed), floors=(0.0,))
                assert partial == whole, (top_p, seed)


def test_a_temperature_too_small_for_float32_samples_the_most_likely_token() -> None:
    # 1e-46 is 0 in float32: divided there, the row was NaN (an IndexError at top_p 0.9, the last
    # token id at top_p 1). The request may send it (temperature only has to be within [0, 2]).
    logits = np.random.default_rng(0).normal(0, 3, VOCAB).astype(np.float32)
    for top_p in (0.9, 1.0):
        for seed in range(3):
            params = SamplingParams(temperature=1e-46, top_p=top_p)
            assert sample(logits, params, np.random.default_rng(seed)) == int(np.argmax(logits))
