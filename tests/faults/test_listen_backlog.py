"""The public listener's queue is `[server] listen_backlog` (issue 11: uvicorn's default of 2,048
overflowed at 10,000 streams and clients got TCP resets). `ss` shows a listening socket's backlog
as its Send-Q; the kernel caps it at net.core.somaxconn, so the test asks for less than that."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live_server import LiveServer, start_server

BACKLOG = 1234


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, {"server": {"listen_backlog": BACKLOG}}) as edge:
        yield edge


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2, scripts/system-deps.sh)")
def test_the_public_listener_queues_listen_backlog_connections(server: LiveServer) -> None:
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert BACKLOG <= somaxconn
    port = server.base_url.rsplit(":", 1)[1]
    listing = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    # State Recv-Q Send-Q Local-Address:Port Peer-Address:Port
    assert listing[0] == "LISTEN" and int(listing[2]) == BACKLOG
