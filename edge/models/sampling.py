"""A model's sampling defaults: what a request that omits temperature / top_p / top_k /
repetition_penalty gets.

As vLLM applies a checkpoint's generation_config (its `--generation-config auto`, the default):
temperature and top_p from the setting if given, else the checkpoint's generation_config.json, else
the model card's recommendation for a packaged model we know, else 1.0 (plain sampling); top_k and
repetition_penalty from generation_config.json, else off. A Qwen2.5 checkpoint says top_k 20 and
repetition_penalty 1.05: without them a request samples from the whole vocabulary, unpenalised, and
reads differently here than on vLLM. A request's own values always win (edge/pipeline.py).

A file's value outside what a replica takes (schemas.py: temperature 0 to 2; top_p from float32's
smallest normal number up to 1, what a request's top_p of 0 to 1 is sent as, or greedy below it;
top_k -1 to 1024, TensorRT-LLM's bound; repetition_penalty above 0 up to 10) is left out, with a
warning: the replicas would refuse it for every request that omits the parameter; the next source
(the model card's, else 1.0) applies instead. A top_k of 50, transformers 4.x's default, is applied
as written, as vLLM does with transformers 5 (whose defaults are unset); with 4.x vLLM drops it as a
default, so a file that says 50 means it. vLLM's `min_p` is not applied:
a request cannot ask for it here (the replicas have no min-p sampling), so neither can a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import structlog

from edge.config import ModelConfig
from edge.float32 import FLOAT32_MIN_NORMAL
from gpu_container.checkpoint.bundled import PACKAGE
from gpu_container.checkpoint.facts import GENERATION_CONFIG

log = structlog.get_logger()

# SmolLM2-135M-Instruct's model card (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct): "we
# recommend temperature 0.2 and top_p 0.9". The GGUF carries no generation_config of its own.
_MODEL_CARDS: dict[str, tuple[float, float]] = {PACKAGE: (0.2, 0.9)}
MAX_TOP_K = 1024
MAX_REPETITION_PENALTY = 10.0
MAX_TEMPERATURE = 2.0


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # off
    repetition_penalty: float = 1.0  # off


def sampling_defaults(model: ModelConfig, model_dir: Path) -> SamplingDefaults:
    found = _generation_config(model_dir)
    card = _MODEL_CARDS.get(model.source) if not model.path else None
    # The file's temperature and top_p only where a request could send them: a top_p of 0 (which
    # transformers takes) or a negative temperature made the replica refuse every request that
    # omitted it, a 400 naming no parameter; 1e-300 is 0 in a Triton replica's FP32 tensor.
    temperature = _first(
        model.default_temperature,
        _within(model_dir, "temperature", found.get("temperature"), 0.0, MAX_TEMPERATURE),
        card and card[0],
        1.0,
    )
    top_p = _first(
        model.default_top_p,
        _within(model_dir, "top_p", found.get("top_p"), FLOAT32_MIN_NORMAL, 1.0),
        card and card[1],
        1.0,
    )
    top_k = found.get("top_k", 0)
    if not (isinstance(top_k, int) and not isinstance(top_k, bool) and -1 <= top_k <= MAX_TOP_K):
        _left_out(model_dir, "top_k", top_k)
        top_k = 0
    penalty = found.get("repetition_penalty", 1.0)
    if not (_number(penalty) and 0 < penalty <= MAX_REPETITION_PENALTY):
        _left_out(model_dir, "repetition_penalty", penalty)
        penalty = 1.0
    return SamplingDefaults(temperature, top_p, max(top_k, 0), float(penalty))


def _generation_config(model_dir: Path) -> dict[str, Any]:
    try:
        loaded = json.loads((model_dir / GENERATION_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _within(model_dir: Path, name: str, value: object, low: float, high: float) -> float | None:
    """`value` if it is a number in [low, high] (NaN is not), else None, with a warning."""
    if _number(value) and low <= value <= high:
        return float(value)
    _left_out(model_dir, name, value)
    return None


def _left_out(model_dir: Path, name: str, value: object) -> None:
    if value is not None:
        where = str(model_dir / GENERATION_CONFIG)
        log.warning("generation_config_value_left_out", file=where, name=name, value=value)


def _first(*values: object) -> float:
    for value in values:
        if _number(value):
            return float(value)
    return 1.0
