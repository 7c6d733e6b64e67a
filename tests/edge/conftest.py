from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.edge.sse_client import LONG_PROMPT, LONG_TOKENS, MODEL, find_long_seed
from tests.support.live_server import LiveServer, start_server

# Limits high enough that the module's requests never trip them (tests of the limits start their own).
ROOMY_TIERS = {
    "free": {
        "priority": 0,
        "requests_per_window": 1000,
        "request_window_s": 3600,
        "tokens_per_window": 10_000_000,
        "token_window_s": 3600,
        "max_concurrent": 8,
        "max_tokens": 1024,
        "max_queue_wait_s": 30.0,
        "on_store_failure": "open",
    },
    "paid": {
        "priority": 10,
        "requests_per_window": 1000,
        "request_window_s": 3600,
        "tokens_per_window": 10_000_000,
        "token_window_s": 3600,
        "max_concurrent": 8,
        "max_tokens": 2000,
        "max_queue_wait_s": 60.0,
        "on_store_failure": "open",
    },
}


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp: Path = tmp_path_factory.mktemp("edge")
    with start_server(tmp, {"tiers": ROOMY_TIERS, "server": {"max_body_bytes": 65536}}) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="package")
def long_body(server: LiveServer) -> dict[str, Any]:
    """A streaming request that generates LONG_TOKENS tokens (never stops early)."""
    with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        seed = find_long_seed(client, server.keys["paid"])
    return {"model": MODEL, "messages": LONG_PROMPT, "seed": seed, "max_tokens": LONG_TOKENS, "stream": True}
