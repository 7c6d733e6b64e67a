"""Load a Hugging Face-style Llama checkpoint directory: config.json and *.safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy.typing as npt

from gpu_container.engine.llama_config import LlamaConfig
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.safetensors_io import load_safetensors
from gpu_container.engine.weights import LlamaWeights


def load_model(path: str | Path) -> LlamaModel:
    """The model in `path`. Its config's eos ids include generation_config.json's, as HF generate does."""
    directory = Path(path)
    raw: dict[str, Any] = json.loads((directory / "config.json").read_text())
    generation = directory / "generation_config.json"
    if generation.is_file():
        extra = json.loads(generation.read_text()).get("eos_token_id")
        if extra is not None:
            known = raw.get("eos_token_id")
            ids = [] if known is None else [known] if isinstance(known, int) else list(known)
            ids += [extra] if isinstance(extra, int) else list(extra)
            raw = {**raw, "eos_token_id": list(dict.fromkeys(ids))}
    config = LlamaConfig.from_hf(raw)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    tensors: dict[str, npt.NDArray[Any]] = {}
    for file in files:
        tensors.update(load_safetensors(file))
    return LlamaModel(config, LlamaWeights.from_hf(config, tensors))
