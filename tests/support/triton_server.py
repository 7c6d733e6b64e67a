"""One real tritonserver (from the nvidia-pytriton wheel) per test session, serving the CPU repository
over the same demo model the test edges tokenize with.

Every area that needs it imports the fixture into its conftest.py:
`from tests.support.triton_server import local_triton  # noqa: F401`.
Each conftest then holds its own session fixture, so the server itself is shared here: the first
user starts it, the last one to leave stops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from tests.support.live_server import PINNED_KNEE_ROWS, demo_model_dir

# Small enough that "all blocks free" is a sharp check, big enough for 20 concurrent streams.
ENGINE_CONFIG = EngineConfig(
    block_size=16,
    num_blocks=512,
    max_num_seqs=64,
    max_num_batched_tokens=512,
    gemv_knee_rows=PINNED_KNEE_ROWS,
)


@dataclass(frozen=True)
class LocalTriton:
    process: TritonProcess
    model_dir: Path
    engine_config: EngineConfig

    @property
    def spec(self) -> str:
        """`HOST:HTTP_PORT:METRICS_PORT`, what `triton_upstreams` takes to reach this server."""
        return self.process.replica_spec


@dataclass
class _Shared:
    triton: LocalTriton | None = None
    users: int = 0


_shared = _Shared()


@contextmanager
def shared_local_triton(repository_dir: Path) -> Iterator[LocalTriton]:
    """The session's tritonserver: started on first entry, stopped when the last user exits."""
    triton = _shared.triton
    if triton is None:
        model_dir = demo_model_dir()
        repository = render_cpu_repository(repository_dir, model_dir, ENGINE_CONFIG)
        triton = _shared.triton = LocalTriton(start_local_triton(repository), model_dir, ENGINE_CONFIG)
    _shared.users += 1
    try:
        yield triton
    finally:
        _shared.users -= 1
        if _shared.users == 0:
            _shared.triton = None
            triton.process.stop()


@contextmanager
def own_local_triton(repository_dir: Path, engine_config: EngineConfig) -> Iterator[LocalTriton]:
    """A tritonserver of the caller's own over the demo model with `engine_config` (a replica small
    enough that a test sees a share of it), stopped on exit."""
    model_dir = demo_model_dir()
    repository = render_cpu_repository(repository_dir, model_dir, engine_config)
    process = start_local_triton(repository)
    try:
        yield LocalTriton(process, model_dir, engine_config)
    finally:
        process.stop()


@pytest.fixture(scope="session")
def local_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    with shared_local_triton(tmp_path_factory.mktemp("cpu-repository")) as triton:
        yield triton
