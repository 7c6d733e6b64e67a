"""Next-token choice: greedy at temperature 0, else temperature + top-p (nucleus) sampling with the
request's own generator, so a seeded request draws the same tokens whatever it is batched with.

Presence and frequency penalties come first, as OpenAI defines them: a token's logit less
`presence_penalty` if the reply has generated it, and `frequency_penalty` times how often (vLLM
counts the reply's tokens alone too; the prompt's are not penalised). They change the greedy choice
as well. In production TensorRT-LLM applies its inputs of the same names, and counts the prompt's
tokens too unless told to skip them (its `prompt_ignore_length` input, in releases newer than the
model repository here declares): the same words, a stronger penalty where the prompt repeats them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpu_container.engine.arrays import Floats
from gpu_container.engine.types import SamplingParams


def sample(
    logits: Floats, params: SamplingParams, rng: np.random.Generator | None, generated: Sequence[int] = ()
) -> int:
    """One token id from a [vocab] row of logits; `generated`: the reply's tokens so far."""
    if generated and (params.presence_penalty or params.frequency_penalty):
        logits = _penalised(logits, params, generated)
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


def _penalised(logits: Floats, params: SamplingParams, generated: Sequence[int]) -> Floats:
    ids, counts = np.unique(np.asarray(generated), return_counts=True)
    out = logits.astype(np.float32, copy=True)  # the batch's row stays as the forward pass left it
    out[ids] -= counts * params.frequency_penalty + params.presence_penalty
    return out


def _draw(cumulative: np.ndarray[tuple[int], np.dtype[np.float64]], rng: np.random.Generator) -> int:
    """An index drawn in proportion to the unnormalised weights whose running sum is `cumulative`."""
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(cumulative) - 1)
