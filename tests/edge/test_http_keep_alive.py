"""How long the edge keeps an idle client connection ([server] http_keep_alive_s), on a served edge
over raw sockets, so nothing on the client side decides when the connection closes.

Behind an ALB the edge must outlast the ALB's idle timeout: at uvicorn's own 5 s the edge closed
connections the ALB was about to reuse, which the ALB answers 502 (the example environment sets it
from the ALB's, tests/iac/test_structure.py). A long keep-alive must not hold up a shutdown."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.live_server import LiveServer, start_server
from tests.support.raw_http import get_healthz

# Below uvicorn's own keep-alive (5 s): only the setting can have closed the connection by then.
CLOSE_WITHIN_S = 3.0


def _connect_and_request(live: LiveServer) -> socket.socket:
    """A connection that has had one complete response and now sits idle."""
    sock = socket.create_connection(("127.0.0.1", live.settings.server.port), timeout=CLOSE_WITHIN_S)
    assert get_healthz(sock).startswith(b"HTTP/1.1 200 ")
    return sock


def test_an_idle_connection_is_closed_after_the_setting(tmp_path: Path) -> None:
    with start_server(tmp_path, {"server": {"http_keep_alive_s": 0.2}}) as live:
        with _connect_and_request(live) as sock:
            # socket.timeout here means the setting never reached uvicorn.
            assert sock.recv(1) == b""


def test_a_long_keep_alive_does_not_hold_up_shutdown(tmp_path: Path) -> None:
    # uvicorn's graceful shutdown bound is the drain's span + SHUTDOWN_GRACE_S (edge/server.py):
    # at the tests' span of 0 it is 2 s, below CLOSE_WITHIN_S, and an edge whose shutdown waited
    # on idle clients closed the connection there in time anyway. A span of its own keeps it far.
    live = start_server(tmp_path, {"server": {"http_keep_alive_s": 3600.0, "drain_deadline_s": 60.0}})
    try:
        assert live._server.config.timeout_graceful_shutdown > 10 * CLOSE_WITHIN_S
        sock = _connect_and_request(live)
        assert get_healthz(sock).startswith(b"HTTP/1.1 200 ")  # the same connection serves the next one
        live._server.should_exit = True
        # Closed at once at shutdown, long before uvicorn's graceful shutdown bound would cut it:
        # socket.timeout here means a shutdown waits on idle clients.
        assert sock.recv(1) == b""
        sock.close()
    finally:
        live.stop()
