"""Read a .safetensors file into float32-ready numpy arrays, bfloat16 included.

safetensors.numpy has no bfloat16 (numpy lacks the type), yet most Hugging Face Llama checkpoints are
stored in it. A bfloat16 is the top half of a float32, so those tensors are widened by a shift; the
file's layout (8-byte header length, JSON header, raw little-endian data) is the format's spec.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from safetensors import safe_open


def load_safetensors(path: Path) -> dict[str, npt.NDArray[Any]]:
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    bf16 = {name for name, info in header.items() if info["dtype"] == "BF16"}
    tensors: dict[str, npt.NDArray[Any]] = {}
    with safe_open(str(path), framework="np") as f:
        for name in header.keys() - bf16:
            tensors[name] = f.get_tensor(name)
    if bf16:
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
        for name in bf16:
            start, stop = header[name]["data_offsets"]
            halves = raw[start:stop].view("<u2").astype(np.uint32)
            tensors[name] = (halves << 16).view(np.float32).reshape(header[name]["shape"])
    return tensors
