"""Undo llama.cpp's row permutation of the Q and K projections.

convert_hf_to_gguf.py reorders each head's rows from HF's rotate-half layout (first half of the
head, then second) to interleaved pairs for its RoPE kernel: reshape(heads, 2, d/2).swapaxes(1, 2).
Loaded without the inverse the model still runs and answers garbage, so the inverse is applied
here: Q with the attention head count, K with the KV head count.
"""

from __future__ import annotations

import numpy as np

from gpu_container.engine.arrays import Floats


def unpermute_rows(weight: Floats, heads: int) -> Floats:
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"{rows} rows do not split into {heads} heads of pairs")
    pairs = weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
    return np.ascontiguousarray(pairs.swapaxes(1, 2).reshape(weight.shape))
