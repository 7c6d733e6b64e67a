"""Past the connections its open-file limit leaves room for, `floodgate serve` answers each new one
503 `server_busy` with Retry-After and closes it (edge/connection_cap.py); a stream already running
finishes. Run as the operator runs it, as a subprocess under a low descriptor limit, with real
sockets: idle ones held past the limit, then a flood of requests.

Before the cap every descriptor went to idle connections, and libuv accepted each further client
and closed it at once: no answer, no line, no metric."""

from __future__ import annotations

import json
import re
import resource
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edge.open_files import RESERVED_FDS, connection_cap
from tests.edge.sse_client import CHAT, MODEL
from tests.faults.serve_process import serve_process

# The edge's descriptors: 64 streams and 64 connections past the reserve (the demo model's streams
# hold one descriptor each, the client's).
LIMIT = RESERVED_FDS + 64
CAP = connection_cap(LIMIT, 64, 1)
# Idle connections held: as many as the edge has descriptors, as in the report.
IDLE = LIMIT
FLOOD = 300


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


@pytest.fixture
def room_for_the_clients() -> Iterator[None]:
    """This process holds every client socket: IDLE + FLOOD of them, past a usual soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE + FLOOD + 256
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open-file limit ({hard}) holds fewer than {need} sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _answer(sock: socket.socket) -> bytes:
    """What the server wrote before it closed: a reset after the answer (the client's bytes unread
    by a connection closed at once) still leaves the answer read."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return data


def _busy(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 503 ") or not re.search(rb"\r\nretry-after: 1\r\n", head):
        return False
    return bool(json.loads(body)["error"]["code"] == "server_busy")


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_connections_past_the_open_file_limit_are_answered_503_and_streams_finish(
    tmp_path: Path, room_for_the_clients: None
) -> None:
    assert CAP == 64
    sections: dict[str, dict[str, object]] = {
        "server": {"drain_accept_s": 0},
        "limiter": {"backend": "memory"},
    }
    held: list[socket.socket] = []
    try:
        with serve_process(tmp_path, sections, {"preexec_fn": _limit_descriptors}) as server:
            port = int(server.base_url.rsplit(":", 1)[1])
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 200,
                "ignore_eos": True,
                "stream": True,
            }
            with (
                httpx.Client(base_url=server.base_url, timeout=60) as client,
                client.stream("POST", CHAT, json=body, headers=server.auth()) as stream,
            ):
                assert stream.status_code == 200
                events = stream.iter_lines()
                assert next(line for line in events if line.startswith("data: ")).startswith("data: {")

                # As many idle connections as the edge has descriptors, then a flood of requests. The
                # kernel hands them to the edge in the order they came: the first CAP - 1 (the stream
                # holds one) are its connections, every later one is past the cap.
                held = [socket.create_connection(("127.0.0.1", port)) for _ in range(IDLE)]
                flood = []
                for _ in range(FLOOD):
                    sock = socket.create_connection(("127.0.0.1", port))
                    sock.settimeout(30)
                    try:
                        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: edge\r\n\r\n")
                    except OSError:
                        pass  # closed already: its answer is still there to read
                    flood.append(sock)
                answers = [_answer(sock) for sock in flood]
                unanswered = [i for i, answer in enumerate(answers) if not _busy(answer)]
                assert not unanswered, (len(unanswered), answers[unanswered[0]][:300])
                # A page calling the API (any origin by default) reads it too.
                assert b"\r\naccess-control-allow-origin: *\r\n" in answers[0]
                # The idle ones past the cap were answered too, without asking.
                for sock in held[CAP - 1 :]:
                    sock.settimeout(30)
                assert all(_busy(_answer(sock)) for sock in held[CAP - 1 :])

                # The stream running all along ends as any other.
                rest = list(events)
            assert [line for line in rest if line.startswith("data: ")][-1] == "data: [DONE]"
            assert not any('"error"' in line for line in rest), rest[-5:]

            turned_away = IDLE - (CAP - 1) + FLOOD
            metrics = httpx.get(server.ops_url + "/metrics", timeout=30).text
            assert f"floodgate_connections_turned_away_total {float(turned_away)}" in metrics
            for sock in held:
                sock.close()
            server.proc.terminate()
            assert server.proc.wait(timeout=60) == 0, server.output()[-3000:]
    finally:
        for sock in held:  # a failure's too
            sock.close()
    # Said, but never a line per connection: at most one a second, with how many since the last.
    said = [json.loads(line) for line in server.output().splitlines() if '"connections_turned_away"' in line]
    assert said and said[0]["open_connections"] == said[0]["max_connections"] == CAP
    assert len(said) < turned_away / 10, len(said)
