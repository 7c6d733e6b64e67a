"""The sampler's distribution: greedy, temperature, and the top-p cut."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpu_container.engine.sampler import sample
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


def test_low_temperature_sharpens() -> None:
    assert _frequencies(SamplingParams(temperature=0.2))[0] > 0.9
