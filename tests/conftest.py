"""Session-wide test setup shared by every area. Area fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
