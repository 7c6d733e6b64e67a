"""Session-wide test setup shared by every area. Area fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import pytest

from tests.server_marker import mark_server_tests


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests that start real servers (tests/server_marker.py): `-m "not server"` is the
    fast loop of unit tests."""
    mark_server_tests(items)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
