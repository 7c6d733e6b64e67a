"""Real redis-server processes for the limiter tests (skipped when the binary is missing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, start_redis
from tests.support.tls_files import TlsFiles, make_tls_files


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA and a certificate for 127.0.0.1, for servers started with TLS."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


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
