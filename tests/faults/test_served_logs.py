"""A served edge as an operator finds it on the host: every log line one JSON object, the lines of
the libraries under it (uvicorn's, Litestar's, botocore's) too; its database files its own."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

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


def test_a_served_edges_files_are_its_own(tmp_path: Path) -> None:
    """Under the usual umask (022) the keys, usage and message databases were world-readable:
    stored prompts and replies, and the key hashes, open to every account on the host."""
    old = os.umask(0o022)
    try:
        with serve_process(tmp_path, {}) as server:
            reply = httpx.post(
                f"{server.base_url}/v1/chat/completions",
                json={
                    "model": "floodgate-tiny",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                    "conversation_id": "c1",
                },
                headers=server.auth(),
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
            made = sorted(p for p in tmp_path.rglob("*.db*") if p.is_file())
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in made}
    finally:
        os.umask(old)
    assert any(name.endswith(".db") for name in modes), modes
    assert all(mode & 0o077 == 0 for mode in modes.values()), {n: oct(m) for n, m in modes.items()}
