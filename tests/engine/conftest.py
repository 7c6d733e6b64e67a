"""Engine test fixtures: the demo checkpoint, built once per session into a temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_container.engine.demo_model import build_demo_model


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("engine") / "demo-model")
