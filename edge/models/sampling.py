"""A model's sampling defaults: what a request that omits temperature / top_p gets.

As vLLM applies a checkpoint's generation_config: the setting if given, else the checkpoint's
generation_config.json, else the model card's recommendation for a packaged model we know, else
1.0 (plain sampling). A request's own values always win (edge/pipeline.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.config import ModelConfig
from gpu_container.checkpoint.bundled import PACKAGE
from gpu_container.checkpoint.facts import GENERATION_CONFIG

# SmolLM2-135M-Instruct's model card (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct): "we
# recommend temperature 0.2 and top_p 0.9". The GGUF carries no generation_config of its own.
_MODEL_CARDS: dict[str, tuple[float, float]] = {PACKAGE: (0.2, 0.9)}


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0


def sampling_defaults(model: ModelConfig, model_dir: Path) -> SamplingDefaults:
    found = _generation_config(model_dir)
    card = _MODEL_CARDS.get(model.source) if not model.path else None
    temperature = _first(model.default_temperature, found.get("temperature"), card and card[0], 1.0)
    top_p = _first(model.default_top_p, found.get("top_p"), card and card[1], 1.0)
    return SamplingDefaults(temperature, top_p)


def _generation_config(model_dir: Path) -> dict[str, Any]:
    try:
        loaded = json.loads((model_dir / GENERATION_CONFIG).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _first(*values: object) -> float:
    for value in values:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return 1.0
