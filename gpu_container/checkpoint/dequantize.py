"""GGUF tensors to float32 arrays in Hugging Face (row-major [out, in]) shape, with the `gguf`
library's own dequantizers; only the types we test are accepted."""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, quants

from gpu_container.checkpoint.errors import UnsupportedModel
from gpu_container.engine.arrays import Floats

Q = GGMLQuantizationType
SUPPORTED_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K})


def check_types(path: object, tensors: list[Any]) -> None:
    """Refuse the file before any work if one tensor has a type we do not dequantize."""
    bad = {t.name: Q(t.tensor_type).name for t in tensors if t.tensor_type not in SUPPORTED_TYPES}
    if bad:
        found = ", ".join(f"{name} ({kind})" for name, kind in list(bad.items())[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise UnsupportedModel(
            f"{path}: unsupported tensor type in {found}{more}; supported types: {supported}"
        )


def dequantized(tensor: Any) -> Floats:
    # GGUF lists dimensions fastest-first (ne0 = columns): numpy's shape is the reverse.
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    array = quants.dequantize(np.asarray(tensor.data), Q(tensor.tensor_type))
    return np.ascontiguousarray(array.reshape(shape), dtype=np.float32)
