"""Next-token choice: greedy at temperature 0, else temperature + top-k + top-p (nucleus) sampling
with the request's own generator, so a seeded request draws the same tokens whatever it is batched
with. top_k 1 is greedy whatever the temperature, as TensorRT-LLM's runtime_top_k 1 is.

Presence and frequency penalties come first, as OpenAI defines them: a token's logit less
`presence_penalty` if the reply has generated it, and `frequency_penalty` times how often (vLLM
counts the reply's tokens alone too; the prompt's are not penalised). They change the greedy choice
as well. In production TensorRT-LLM applies its inputs of the same names, and counts the prompt's
tokens too unless told to skip them (its `prompt_ignore_length` input, in releases newer than the
model repository here declares): the same words, a stronger penalty where the prompt repeats them.

Before those, the repetition penalty (vLLM's and TensorRT-LLM's extension): each token the prompt
or the reply holds has its logit divided by it when positive, multiplied when negative. It scales
rather than adds, so its place matters: after `logit_bias`, as vLLM (its logits processors, the bias
among them, run before the penalties) and TensorRT-LLM (its penalty kernel adds `embedding_bias`
first) apply it, so a biased token the prompt holds scores (logit + bias) / penalty on all three.

`logit_bias` comes first of all, as OpenAI defines it (TensorRT-LLM's `embedding_bias`, a [vocab]
row it adds to the logits): before the temperature and the greedy choice alike, so +100 all but
forces a token and -100 all but bans it.

Last, `min_tokens` (vLLM's, TensorRT-LLM's `min_length`): while the reply holds fewer tokens, the
tokens that would end it get a logit of -inf, greedy too, so nothing can end it sooner whatever the
bias: the request's stop_token_ids and the model's eos (`eos`, unless ignore_eos), as vLLM masks
them, or the request's `min_tokens_ids` where it names them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from gpu_container.engine.arrays import Floats
from gpu_container.engine.types import SamplingParams


def sample(
    logits: Floats,
    params: SamplingParams,
    rng: np.random.Generator | None,
    generated: Sequence[int] = (),
    prompt: Sequence[int] = (),
    eos: Collection[int] = (),
) -> int:
    """One token id from a [vocab] row of logits; `generated`: the reply's tokens so far, `prompt`
    the prompt's (only the repetition penalty reads it), `eos` the model's end tokens (only
    min_tokens reads them)."""
    held = len(generated) < params.min_tokens
    if (
        held
        or params.repetition_penalty != 1.0
        or params.presence_penalty
        or params.frequency_penalty
        or params.logit_bias
    ):
        logits = _adjusted(logits, params, generated, prompt, held_back(params, eos) if held else ())
    if params.temperature == 0 or rng is None or params.top_k == 1:
        return int(np.argmax(logits))
    # exp in float32 (numpy's float64 exp costs 8x as much over a 49,152-entry row); the sums below
    # run in float64, so 49,152 terms lose nothing to rounding.
    # The division in float64: a temperature too small for float32 (1e-46 is 0 there) would make
    # the row NaN; scaled and narrowed (what falls past float32's range is -inf, weight 0), it is
    # the greedy row it should be.
    with np.errstate(over="ignore"):
        scaled = ((logits - logits.max()).astype(np.float64) / params.temperature).astype(np.float32)
    probs = np.exp(scaled)
    if 0 < params.top_k < probs.size:
        # The k largest stay (ties with the k-th too); top_p then cuts within them.
        kth = np.partition(probs, -params.top_k)[-params.top_k]
        probs = np.where(probs >= kth, probs, np.float32(0.0))
    weights = probs.astype(np.float64)
    if params.top_p < 1.0:
        return nucleus(weights, params.top_p, rng)
    return _draw(np.cumsum(weights), rng)


# Where the nucleus looks first, as fractions of the most likely token's weight (0: every token).
NUCLEUS_FLOORS = (1e-3, 1e-6, 0.0)


def nucleus(
    weights: np.ndarray[tuple[int], np.dtype[np.float64]],
    top_p: float,
    rng: np.random.Generator,
    floors: tuple[float, ...] = NUCLEUS_FLOORS,
) -> int:
    """A token drawn from the smallest set of most likely tokens whose weight reaches `top_p` of the
    row's (always at least the most likely one), in proportion to `weights` (unnormalised).

    Sorting the whole vocabulary for every token was most of the engine's time at a top_p default
    (49,152 entries, a stable argsort each), yet the nucleus is almost always a few dozen tokens.
    So this sorts only the tokens within a factor (`floors`) of the most likely one, and looks
    further down only while their weight falls short: tokens at or above a weight are a prefix of
    the whole row sorted, ties included. They come in index order and sort stably, so ties rank as
    a stable sort of the whole row ranks them, and the running sums are the same additions in the
    same order as over the whole row sorted: the same token for the same draw."""
    threshold = top_p * float(weights.sum())
    top = float(weights.max())
    for floor in floors:
        # Tokens of no weight (a top_k cut, exp underflow) can never be drawn nor end the prefix.
        candidates = np.flatnonzero(weights >= top * floor) if floor > 0 else np.flatnonzero(weights)
        order = candidates[np.argsort(-weights[candidates], kind="stable")]
        cumulative = np.cumsum(weights[order])
        if cumulative[-1] >= threshold:
            break
    # Past the last floor the whole row is in: its sum may round a hair under the threshold.
    keep = min(int(np.searchsorted(cumulative, threshold)) + 1, cumulative.size)
    return int(order[_draw(cumulative[:keep], rng)])


def held_back(params: SamplingParams, eos: Collection[int]) -> tuple[int, ...]:
    """The tokens min_tokens keeps from ending the reply: `min_tokens_ids` where the request names
    them, else every token that would end it (its stop_token_ids, and `eos` unless ignore_eos)."""
    if params.min_tokens_ids is not None:
        return params.min_tokens_ids
    if params.ignore_eos:
        return params.stop_token_ids
    return (*params.stop_token_ids, *eos)


def _adjusted(
    logits: Floats,
    params: SamplingParams,
    generated: Sequence[int],
    prompt: Sequence[int],
    held: Sequence[int] = (),
) -> Floats:
    """The row with the request's adjustments, in the module doc's order: the logit_bias added, the
    repetition penalty on every token of `prompt` and `generated` (divided when positive, multiplied
    when negative: CTRL's rule, as vLLM and TensorRT-LLM apply it), the presence and frequency
    penalties taken off the `generated` tokens, and the `held` tokens (min_tokens) at -inf."""
    out = logits.astype(np.float32, copy=True)  # the batch's row stays as the forward pass left it
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias, strict=True)
        out[list(ids)] += np.asarray(biases, dtype=np.float32)
    penalty = params.repetition_penalty
    if penalty != 1.0 and (prompt or generated):
        seen = np.unique(
            np.concatenate((np.asarray(prompt, dtype=np.int64), np.asarray(generated, dtype=np.int64)))
        )
        values = out[seen]
        # A penalty near 0 divides a positive logit past float32's range: +inf, and then inf - inf
        # is NaN in the softmax (an IndexError, an "error" for the request). Held at float32's
        # largest value, such tokens tie, as infinitely preferred: the first of them greedy, any of
        # them sampled. Only these tokens can overflow (the bias before and the penalties after
        # are bounded sums).
        with np.errstate(over="ignore"):
            penalised = np.where(values > 0, values / penalty, values * penalty)
        out[seen] = np.minimum(penalised, _FLOAT32_MAX)
    if generated and (params.presence_penalty or params.frequency_penalty):
        seen, counts = np.unique(np.asarray(generated), return_counts=True)
        out[seen] -= counts * params.frequency_penalty + params.presence_penalty
    if held:
        out[list(held)] = -np.inf
    return out


_FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


def _draw(cumulative: np.ndarray[tuple[int], np.dtype[np.float64]], rng: np.random.Generator) -> int:
    """An index drawn in proportion to the unnormalised weights whose running sum is `cumulative`."""
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(cumulative) - 1)
