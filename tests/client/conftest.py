"""One real edge for the client tests, stopped when they are done: a free loopback port, live.py settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.live import OVERRIDES
from tests.support.live_server import LiveServer, start_server


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("edge"), overrides=OVERRIDES) as live:
        yield live
