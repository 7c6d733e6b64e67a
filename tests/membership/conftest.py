"""Fixtures the fleet membership tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, start_redis


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own (a test may empty or kill it)."""
    server = start_redis()
    yield server
    server.kill()
