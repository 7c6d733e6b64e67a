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
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least the best token).
        keep = int(np.searchsorted(cumulative, params.top_p)) + 1
        kept = order[:keep]
        kept_probs = probs[kept] / probs[kept].sum()
        return int(kept[rng.choice(keep, p=kept_probs)])
    return int(rng.choice(len(probs), p=probs))
