"""One real tritonserver (from the nvidia-pytriton wheel) per session, serving the CPU repository
with the demo model; tests reach it through TritonUpstream."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu_repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton

# Small enough that "all blocks free" is a sharp check, big enough for 20 concurrent streams.
ENGINE_CONFIG = EngineConfig(block_size=16, num_blocks=512, max_num_seqs=64, max_num_batched_tokens=512)


@dataclass(frozen=True)
class LocalTriton:
    process: TritonProcess
    model_dir: Path
    engine_config: EngineConfig


@pytest.fixture(scope="session")
def local_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    model_dir = build_demo_model(tmp_path_factory.mktemp("demo") / "model")
    repository = render_cpu_repository(tmp_path_factory.mktemp("cpu-repository"), model_dir, ENGINE_CONFIG)
    process = start_local_triton(repository)
    try:
        yield LocalTriton(process, model_dir, ENGINE_CONFIG)
    finally:
        process.stop()
