"""Real redis-server processes for the limiter tests (skipped when the binary is missing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, start_redis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One standalone server for the session; tests keep apart by using their own user names."""
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A server this test alone uses (and may kill)."""
    server = start_redis()
    yield server
    server.kill()
