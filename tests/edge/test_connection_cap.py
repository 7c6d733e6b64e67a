"""At the connections its open-file limit leaves room for, `floodgate serve` closes its oldest idle
connection for a new client (edge/idle_connections.py), and where every connection is busy answers
the new one 503 `server_busy` with Retry-After and closes it (edge/connection_cap.py); a stream
already running finishes. Run as the operator runs it, as a subprocess under a low descriptor
limit, with real sockets.

Before the cap every descriptor went to idle connections, and libuv accepted each further client
and closed it at once: no answer, no line, no metric. With the cap alone, idle connections kept
alive after an answer (75 s by default) or that never sent a request turned every new client away."""

from __future__ import annotations

import json
import re
import resource
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from edge.open_files import OPS_MAX_CONNECTIONS, RESERVED_FDS, connection_cap
from tests.edge.sse_client import CHAT, MODEL
from tests.faults.serve_process import ServeProcess, serve_process

# The edge's descriptors: 64 streams and 64 connections past the reserve (the demo model's streams
# hold one descriptor each, the client's).
LIMIT = RESERVED_FDS + 64
CAP = connection_cap(LIMIT, 64, 1)
FLOOD = 300
# Never reached: a held request's body and head wait as long as the test needs.
SECTIONS: dict[str, dict[str, object]] = {
    "server": {"drain_accept_s": 0, "body_timeout_s": 600, "header_timeout_s": 600},
    "limiter": {"backend": "memory"},
}
# Any idle connection may be taken (1 s by default: the test would wait that out).
RECLAIM_AT_ONCE = SECTIONS | {"server": {**SECTIONS["server"], "idle_reclaim_after_s": 0}}
STREAM = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 200,
    "ignore_eos": True,
    "stream": True,
}


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


@pytest.fixture
def room_for_the_clients() -> Iterator[None]:
    """This process holds every client socket: CAP + FLOOD of them, past a usual soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = CAP + FLOOD + 256
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


def _port(server: ServeProcess) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


@contextmanager
def _running_stream(server: ServeProcess) -> Iterator[Iterator[str]]:
    """A stream under way (its first event read): the rest of its lines."""
    with (
        httpx.Client(base_url=server.base_url, timeout=60) as client,
        client.stream("POST", CHAT, json=STREAM, headers=server.auth()) as stream,
    ):
        assert stream.status_code == 200
        events = stream.iter_lines()
        assert next(line for line in events if line.startswith("data: ")).startswith("data: {")
        yield events


def _busy_connection(server: ServeProcess) -> socket.socket:
    """A connection with a request under way: a chat request's head asking for 100 Continue, its
    body never sent. Read to its 100, so the edge has read the head (a connection that sent nothing
    yet is idle to it)."""
    sock = socket.create_connection(("127.0.0.1", _port(server)))
    sock.settimeout(30)
    auth = server.auth()["Authorization"]
    sock.sendall(
        f"POST {CHAT} HTTP/1.1\r\nHost: edge\r\nAuthorization: {auth}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 100 "), got
    return sock


def _get(sock: socket.socket, path: str, auth: str = "") -> bytes:
    """GET `path` on a kept-alive connection: its answer's status line, the body read whole (the
    connection's next answer starts after it); what came before a close, where it closed."""
    authorization = f"Authorization: {auth}\r\n" if auth else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: edge\r\n{authorization}\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(re.search(rb"\r\ncontent-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(65536)
    return head.split(b"\r\n", 1)[0]


def _metric(server: ServeProcess, name: str) -> float:
    metrics = httpx.get(server.ops_url + "/metrics", timeout=30).text
    match = re.search(rf"^{name} ([0-9.e+]+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_connections_past_the_open_file_limit_are_answered_503_and_streams_finish(
    tmp_path: Path, room_for_the_clients: None
) -> None:
    assert CAP == 64
    held: list[socket.socket] = []
    try:
        with serve_process(tmp_path, SECTIONS, {"preexec_fn": _limit_descriptors}) as server:
            with _running_stream(server) as events:
                # Every other connection the edge may hold busy with a request, then a flood of
                # requests: none has an idle connection to take the place of.
                held = [_busy_connection(server) for _ in range(CAP - 1)]
                flood = []
                for _ in range(FLOOD):
                    sock = socket.create_connection(("127.0.0.1", _port(server)))
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

                # The stream running all along ends as any other.
                rest = list(events)
            assert [line for line in rest if line.startswith("data: ")][-1] == "data: [DONE]"
            assert not any('"error"' in line for line in rest), rest[-5:]

            assert _metric(server, "floodgate_connections_turned_away_total") == FLOOD
            assert _metric(server, "floodgate_idle_connections_closed_total") == 0
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
    assert len(said) < FLOOD / 10, len(said)


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_at_the_cap_the_oldest_idle_connections_are_closed_for_new_clients(
    tmp_path: Path, room_for_the_clients: None
) -> None:
    """Idle connections, those that sent nothing and those kept alive after an answer, make room
    for new clients oldest first; the new clients are served, not turned away; a stream and the
    idle connections that were not needed go on."""
    fresh: list[socket.socket] = []
    kept: list[socket.socket] = []
    newcomers: list[socket.socket] = []
    try:
        with serve_process(tmp_path, RECLAIM_AT_ONCE, {"preexec_fn": _limit_descriptors}) as server:
            auth = server.auth()["Authorization"]
            with _running_stream(server) as events:
                # Connections that sent nothing, then connections kept alive after an answer: every
                # connection the edge may hold. An answer on a later connection means the earlier
                # ones were accepted (the kernel hands them over in order).
                fresh = [socket.create_connection(("127.0.0.1", _port(server))) for _ in range(10)]
                for _ in range(CAP - 1 - len(fresh)):
                    sock = socket.create_connection(("127.0.0.1", _port(server)))
                    sock.settimeout(30)
                    assert _get(sock, "/v1/models", auth) == b"HTTP/1.1 200 OK"
                    kept.append(sock)

                # New clients, one after another, each staying: each is served, in the place of the
                # oldest idle one (kept alive after its answer, it is the newest idle one then).
                new = 20
                for _ in range(new):
                    sock = socket.create_connection(("127.0.0.1", _port(server)))
                    sock.settimeout(30)
                    newcomers.append(sock)
                    assert _get(sock, "/v1/models", auth) == b"HTTP/1.1 200 OK"
                closed = new - len(fresh)
                # Those closed were told nothing, as at a keep-alive timeout: the close alone.
                for sock in fresh + kept[:closed]:
                    sock.settimeout(30)
                    assert _answer(sock) == b""
                # The idle ones not needed still serve.
                for sock in kept[closed:]:
                    assert _get(sock, "/v1/models", auth) == b"HTTP/1.1 200 OK"

                rest = list(events)
            assert [line for line in rest if line.startswith("data: ")][-1] == "data: [DONE]"
            assert _metric(server, "floodgate_idle_connections_closed_total") == new
            assert _metric(server, "floodgate_connections_turned_away_total") == 0
    finally:
        for sock in fresh + kept + newcomers:
            sock.close()


def _ops_port(server: ServeProcess) -> int:
    return int(server.ops_url.rsplit(":", 1)[1])


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_the_operator_listener_holds_its_own_few_connections(tmp_path: Path) -> None:
    """At most OPS_MAX_CONNECTIONS on the operator listener, out of the descriptors' reserve: it had
    the public listener's cap (the open-file limit's worth), and a flood of connections there took
    what the streams need. The public listener serves on meanwhile."""
    # Never idle long enough to be taken: the held ones stay.
    sections = SECTIONS | {"server": {**SECTIONS["server"], "idle_reclaim_after_s": 600}}
    held: list[socket.socket] = []
    try:
        with serve_process(tmp_path, sections) as server:
            ops = ("127.0.0.1", _ops_port(server))
            held = [socket.create_connection(ops) for _ in range(OPS_MAX_CONNECTIONS)]
            with socket.create_connection(ops) as one_more:
                one_more.settimeout(30)
                one_more.sendall(b"GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
                assert _busy(_answer(one_more))
            models = httpx.get(server.base_url + "/v1/models", headers=server.auth(), timeout=30)
            assert models.status_code == 200
    finally:
        for sock in held:
            sock.close()


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_a_listener_at_its_cap_takes_none_of_the_other_listeners_idle_connections(
    tmp_path: Path, room_for_the_clients: None
) -> None:
    """The public listener at its cap, every connection busy, and an idle one on the operator
    listener: the new public client is turned away, not given the operator connection's place (the
    two listeners shared one set of idle connections, and the public one went past its cap)."""
    busy: list[socket.socket] = []
    try:
        with serve_process(tmp_path, RECLAIM_AT_ONCE, {"preexec_fn": _limit_descriptors}) as server:
            with socket.create_connection(("127.0.0.1", _ops_port(server))) as scraper:
                scraper.settimeout(30)
                assert _get(scraper, "/healthz") == b"HTTP/1.1 200 OK"  # kept alive, idle from now
                busy = [_busy_connection(server) for _ in range(CAP)]
                with socket.create_connection(("127.0.0.1", _port(server))) as newcomer:
                    newcomer.settimeout(30)
                    newcomer.sendall(b"GET /v1/models HTTP/1.1\r\nHost: edge\r\n\r\n")
                    assert _busy(_answer(newcomer))
                assert _get(scraper, "/healthz") == b"HTTP/1.1 200 OK"
            assert _metric(server, "floodgate_idle_connections_closed_total") == 0
    finally:
        for sock in busy:
            sock.close()
