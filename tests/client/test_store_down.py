"""The limiter store is down: a fail-closed tier gets a 503 with Retry-After, a fail-open one is served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from floodgate_client import Client, ServiceUnavailableError
from tests.client.live import OVERRIDES, SURE_TEXT
from tests.support.live_server import LiveServer, start_server
from tests.support.ports import free_port


@pytest.fixture(scope="module")
def storeless_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # Nothing listens on this port: every limiter call fails as fast as a dead Redis does.
    overrides = {
        "limiter": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0", "timeout_ms": 100},
        "tiers": {**OVERRIDES["tiers"], "paid": {**OVERRIDES["tiers"]["paid"], "on_store_failure": "closed"}},
    }
    with start_server(Path(tmp_path_factory.mktemp("edge-storeless")), overrides=overrides) as live:
        yield live


def test_a_fail_closed_tier_gets_service_unavailable_with_a_retry_after(storeless_server: LiveServer) -> None:
    with Client(storeless_server.base_url, storeless_server.keys["paid"]) as client:
        with pytest.raises(ServiceUnavailableError) as caught:
            client.chat.stream(**SURE_TEXT, max_tokens=2)
        assert caught.value.status_code == 503
        assert caught.value.retry_after_s is not None and caught.value.retry_after_s > 0
        # auto_retry waits out Retry-After only while the deadline allows, then gives up with the error.
        with pytest.raises(ServiceUnavailableError):
            client.chat.create(**SURE_TEXT, max_tokens=2, auto_retry=True, deadline_s=0.05)


def test_a_fail_open_tier_is_still_served(storeless_server: LiveServer) -> None:
    with Client(storeless_server.base_url, storeless_server.keys["free"]) as client:
        result = client.chat.create(**SURE_TEXT, max_tokens=4)
    assert result.text and result.finish_reason in ("stop", "length")
