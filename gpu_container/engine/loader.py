"""Load a Hugging Face-style Llama checkpoint directory (facts from gpu_container.checkpoint.facts)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy.typing as npt

from gpu_container.checkpoint.errors import CheckpointError, UnsupportedModel
from gpu_container.checkpoint.facts import read_facts
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.safetensors_io import load_safetensors
from gpu_container.engine.weights import LlamaWeights


def load_model(path: str | Path) -> LlamaModel:
    """The model in `path`; a missing or bad file raises CheckpointError naming it."""
    facts = read_facts(path)
    tensors: dict[str, npt.NDArray[Any]] = {}
    for file in facts.weight_files:
        try:
            tensors.update(load_safetensors(file))
        except Exception as exc:  # safetensors raises its own SafetensorError, json/struct their own
            raise CheckpointError(f"{file}: not a readable safetensors file: {exc}") from None
    # A missing tensor, one of another shape, one the model has no place for: a ValueError.
    try:
        weights = LlamaWeights.from_hf(facts.config, tensors)
    except ValueError as exc:
        raise UnsupportedModel(f"{facts.directory}: {exc}") from None
    model = LlamaModel(facts.config, weights)
    del tensors
    _give_back_freed_memory()
    return model


def _give_back_freed_memory() -> None:
    """Return to the system what the load freed and the allocator kept. The file's tensors are read,
    then copied into the model's layout and dropped, and glibc's malloc keeps most of the freed
    space for later: the real model's engine held 1,037 MB after its load against 572 once given
    back (its weights are 540), half a gigabyte per engine process for the whole of its life
    (`make serve` starts two). malloc_trim is glibc's; elsewhere (musl, macOS) nothing is done."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
