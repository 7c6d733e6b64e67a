"""A served edge's log as an operator reads it: every line one JSON object, the lines of the
libraries under it (uvicorn's, Litestar's, botocore's) too."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.faults.serve_process import serve_process

WAIT_S = 20.0


def test_a_library_warning_in_a_served_edge_is_a_json_line(tmp_path: Path) -> None:
    """Litestar's default logging config put its own plain-text handler on the root logger when the
    app was made, so uvicorn's warnings (and Litestar's, botocore's) left the edge as plain text."""
    with serve_process(tmp_path, {}) as server:
        address = urlsplit(server.base_url)
        with socket.create_connection((address.hostname, address.port)) as conn:
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")  # uvicorn logs a warning for it
            conn.recv(1024)
        deadline = time.monotonic() + WAIT_S
        while "Invalid HTTP request" not in server.output():
            assert time.monotonic() < deadline, server.output()[-2000:]
            time.sleep(0.05)  # polling the log file for the line (a bounded wait on a condition)
        output = server.output()
    (line,) = [line for line in output.splitlines() if "Invalid HTTP request" in line]
    record = json.loads(line)
    assert record["logger"] == "uvicorn.error" and record["level"] == "warning", record
