"""Render the CPU model repository (our engine behind the `tensorrt_llm` contract) into a folder."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import msgspec
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from gpu_container.checkpoint.errors import CheckpointError
from gpu_container.checkpoint.facts import read_facts
from gpu_container.engine.types import EngineConfig
from gpu_container.triton import sequence_limit
from gpu_container.triton.model_name import MODEL_NAME

# This package holds the model's files as Triton reads them (config.pbtxt, the model.py shim).
CPU_DIR = Path(__file__).parent
_PROJECT_ROOT = Path(__file__).resolve().parents[3]


def current_python_path() -> str:
    """This process's import path, for the backend stub (which ignores PYTHONPATH). An editable
    install is an import hook the stub never runs, so the project root is named first."""
    return os.pathsep.join([str(_PROJECT_ROOT), *(p for p in sys.path if p)])


def render_cpu_repository(
    dest: Path,
    model_dir: Path,
    engine_config: EngineConfig,
    *,
    cancellation_check_period_ms: int | None = None,
    metrics_period_ms: int | None = None,
    model_name: str = MODEL_NAME,
) -> Path:
    """Write `dest/tensorrt_llm/{config.pbtxt,1/model.py}` serving the checkpoint at `model_dir`.
    Another `model_name` adds a model of that name beside those already in `dest` (one Triton
    serving several of the edge's models, each its own folder).

    The shipped config.pbtxt is parsed and only its `parameters` are set, so what Triton reads is
    always a well-formed ModelConfig.
    """
    config = text_format.Parse((CPU_DIR / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    values: dict[str, object] = {
        "model_dir": model_dir.resolve(),
        "python_path": current_python_path(),
        **msgspec.structs.asdict(engine_config),
    }
    # The engine's own limit (gpu_container/engine/engine.py max_model_len), said to the edge as a
    # TensorRT-LLM repository says its engine's (sequence_limit.py).
    values[sequence_limit.PARAMETER] = _engine_limit(engine_config, model_dir)
    if cancellation_check_period_ms is not None:
        values["cancellation_check_period_ms"] = cancellation_check_period_ms
    if metrics_period_ms is not None:
        values["metrics_period_ms"] = metrics_period_ms
    for key, value in values.items():
        config.parameters[key].string_value = str(value)
    config.name = model_name
    model_root = dest / model_name
    (model_root / "1").mkdir(parents=True, exist_ok=True)
    (model_root / "config.pbtxt").write_text(text_format.MessageToString(config))
    shutil.copy2(CPU_DIR / "model.py", model_root / "1" / "model.py")
    return dest


def _engine_limit(config: EngineConfig, model_dir: Path) -> int:
    """The CPU engine's longest sequence: its max_model_len within its KV pool and the checkpoint's
    positions (gpu_container/engine/engine.py). A folder that is no checkpoint leaves the positions
    out: the model fails to load there, and says why."""
    limit = min(config.max_model_len, config.num_blocks * config.block_size)
    try:
        return min(limit, read_facts(model_dir).max_context)
    except CheckpointError:
        return limit
