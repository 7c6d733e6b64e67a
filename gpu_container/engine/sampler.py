"""Next-token choice: greedy at temperature 0, else temperature + top-p (nucleus) sampling with the
request's own generator, so a seeded request draws the same tokens whatever it is batched with."""

from __future__ import annotations

import numpy as np

from gpu_container.engine.arrays import Floats
from gpu_container.engine.types import SamplingParams


def sample(logits: Floats, params: SamplingParams, rng: np.random.Generator | None) -> int:
    """One token id from a [vocab] row of logits."""
    if params.temperature == 0 or rng is None:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    probs = np.exp(scaled - scaled.max())
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # The smallest prefix whose mass reaches top_p (always at least the most likely token).
        keep = int(np.searchsorted(cumulative, params.top_p * cumulative[-1])) + 1
        return int(order[_draw(cumulative[:keep], rng)])
    return _draw(np.cumsum(probs), rng)


def _draw(cumulative: np.ndarray[tuple[int], np.dtype[np.float64]], rng: np.random.Generator) -> int:
    """An index drawn in proportion to the unnormalised weights whose running sum is `cumulative`."""
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(cumulative) - 1)
