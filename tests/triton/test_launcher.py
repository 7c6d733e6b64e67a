"""A tritonserver that cannot load its model fails the start with Triton's own error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu_repository import render_cpu_repository
from gpu_container.triton.launcher import TritonStartError, start_local_triton


def test_a_model_that_fails_to_load_fails_the_start(tmp_path: Path) -> None:
    repository = render_cpu_repository(tmp_path / "repo", tmp_path / "no-such-model", EngineConfig())
    with pytest.raises(TritonStartError) as failure:
        start_local_triton(repository)
    message = str(failure.value)
    assert "tritonserver exited" in message
    assert "failed to load 'tensorrt_llm'" in message
    assert "no-such-model" in message
