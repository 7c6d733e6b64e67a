"""The real default model, imported once per importer version (tests/support/smollm2.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.smollm2 import smollm2_dir


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return smollm2_dir()
