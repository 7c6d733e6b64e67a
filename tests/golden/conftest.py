"""The real default model for the golden tests: imported once (tests/support/smollm2.py), served by
one edge per path for the module that asks: in-process engines, and a real tritonserver running
our CPU model over the same checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edge.upstreams.triton import triton_upstreams
from gpu_container.checkpoint.bundled import MODEL_NAME
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import start_local_triton
from tests.support.live_server import LiveServer, start_server
from tests.support.smollm2 import smollm2_dir

# Enough KV for the golden prompts (under 64 tokens each, 20 new) without holding the default pool.
ENGINE = {"num_blocks": 64, "block_size": 16, "max_num_seqs": 4}


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return smollm2_dir()


def _edge_settings(model_dir: Path) -> dict[str, object]:
    return {"model": {"path": str(model_dir), "name": MODEL_NAME}, "engine": ENGINE}


@pytest.fixture(scope="module")
def local_edge(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("golden-local"), _edge_settings(smollm2)) as live:
        yield live


@pytest.fixture(scope="module")
def triton_edge(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[LiveServer]:
    config = EngineConfig(block_size=16, num_blocks=64, max_num_seqs=4)
    repository = render_cpu_repository(tmp_path_factory.mktemp("golden-repository"), smollm2, config)
    triton = start_local_triton(repository)
    try:
        spec = triton.replica_spec
        tmp = tmp_path_factory.mktemp("golden-triton")
        with start_server(tmp, _edge_settings(smollm2), triton_upstreams(spec)) as live:
            yield live
    finally:
        triton.stop()


@pytest.fixture(scope="module", params=["local", "triton"])
def edge(request: pytest.FixtureRequest) -> LiveServer:
    server: LiveServer = request.getfixturevalue(f"{request.param}_edge")
    return server
