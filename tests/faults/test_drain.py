"""Drill: SIGTERM to `floodgate serve` with streams in flight.

What a load balancer and the clients must see: `/readyz` fails at once while the listener still
answers; a new request gets 503 with Retry-After and an OpenAI error object (never a refused
connection); every stream in flight ends with an event and `[DONE]`, those still running at the
drain deadline with an error event (`server_shutting_down`) and their usage; the process exits 0
and logs no traceback.

One replica that holds one sequence at a time runs the streams one after the other, each for
LONG_TOKENS tokens, and the engine process is held (SIGSTOP) from SIGTERM until every stream has
ended, so the deadline finds some still running (generating or queued) on any machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import socket
import subprocess
import termios
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from structlog.testing import capture_logs

from edge.config import KeysConfig, load_settings
from edge.drain import Drain
from edge.keys import services
from edge.keys.cli_support import opened_usage
from edge.keys.page import KeyPage
from edge.keys.record import hash_key
from edge.keys.sqlite import SQLiteKeyStore
from edge.keys.store import KeyStore
from edge.server import DrainingServer
from tests.edge.conftest import finished_requests, idle_engine, wait_for_engine_to_drop
from tests.edge.sse_client import (
    CHAT,
    DONE,
    LONG_PROMPT,
    LONG_TOKENS,
    MODEL,
    events,
    find_long_seed,
    wait_until,
)
from tests.faults.serve_process import ServeProcess, serve_process
from tests.faults.stalled_client import open_and_never_read, open_stalled
from tests.support.held_engines import child_pids, children_held, engines_held
from tests.support.live_server import start_server
from tests.support.ports import listening
from tests.support.redis_server import start_redis

STREAMS = 4
DRAIN: dict[str, object] = {"drain_accept_s": 3.0, "drain_deadline_s": 4.0}
BODY = {
    "model": MODEL,
    "messages": LONG_PROMPT,
    "max_tokens": LONG_TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}


class _Stream(threading.Thread):
    def __init__(self, base_url: str, headers: dict[str, str], body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.body = body
        self.base_url = base_url
        self.headers = headers
        self.started = threading.Event()
        # Its first token: a stream cut before it is answered with its error alone and refunded
        # whole, one cut after it billed for what it got.
        self.content = threading.Event()
        self.events: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.base_url, timeout=60.0) as client,
                client.stream("POST", CHAT, json=self.body, headers=self.headers) as response,
            ):
                assert response.status_code == 200, response.read()
                for item in events(response):
                    self.events.append(item)
                    self.started.set()
                    if isinstance(item, dict) and any(
                        c["delta"].get("content") for c in item.get("choices", [])
                    ):
                        self.content.set()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.started.set()
            self.content.set()


def _wait(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_sigterm_drains_streams_and_exits_cleanly(tmp_path: Path) -> None:
    with serve_process(tmp_path, {"server": DRAIN, "engine": {"max_num_seqs": 1}}) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
            body = BODY | {"seed": find_long_seed(client, server.key)}  # runs LONG_TOKENS, no early stop
        streams = [_Stream(server.base_url, server.auth(), body) for _ in range(STREAMS)]
        for stream in streams:
            stream.start()
        for stream in streams:
            assert stream.started.wait(60), "a stream never opened"
            assert stream.error is None, stream.error

        server.proc.send_signal(signal.SIGTERM)
        # Hold the engine still, so the drain deadline finds every unfinished stream unfinished
        # however fast this machine generates; it resumes once they have all ended.
        engine = child_pids(server.proc.pid)
        for pid in engine:
            os.kill(pid, signal.SIGSTOP)

        with httpx.Client(base_url=server.base_url, timeout=10.0) as client:
            _wait(lambda: client.get("/readyz").status_code == 503, "/readyz to fail")
            assert client.get("/readyz").json()["status"] == "draining"
            refused = client.post(CHAT, json=BODY | {"stream": False}, headers=server.auth())
        assert refused.status_code == 503
        # Another instance takes the retry: a second, not the rest of the accept window (3 s here).
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["retry-after-ms"] == "1000"
        assert refused.headers["connection"] == "close"
        assert refused.json()["error"]["code"] == "server_shutting_down"

        for stream in streams:
            stream.join(60)
            assert not stream.is_alive(), "a stream never ended"
            assert stream.error is None, stream.error
        for pid in engine:
            os.kill(pid, signal.SIGCONT)
        assert server.proc.wait(timeout=60) == 0

    cut = 0
    for stream in streams:
        data = [e for e in stream.events if not (isinstance(e, str) and e.startswith(":"))]
        assert data[-1] == DONE
        errors = [e["error"] for e in data if isinstance(e, dict) and "error" in e]
        if errors:
            cut += 1
            assert errors[0]["code"] == "server_shutting_down"
            usage = data[-3]  # just before the error: the SDKs raise at it and read nothing after
            assert data[-2] == {"error": errors[0]} and usage["choices"] == []
            # Charged, and so counted, where it reached the engine: one that streamed says its prompt
            # (one cut while queued behind the held engine cost nothing, and says 0).
            counts = usage["usage"]
            streamed = any(
                isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"].get("content")
                for e in data
            )
            assert counts["prompt_tokens"] > 0 if streamed else counts["completion_tokens"] == 0, counts
        else:
            finals = [
                e
                for e in data
                if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]
            ]
            assert len(finals) == 1
    assert cut >= 1  # the engine was held from SIGTERM on: the last in the queue cannot have finished
    output = server.output()
    assert "Traceback" not in output
    assert "drain_deadline_cut" in output


def test_a_request_refused_by_the_drain_may_send_its_body_whole(tmp_path: Path) -> None:
    """The drain's 503 comes at the headers, before the body, and says `connection: close`. The
    connection closed with it, the client's body still unread: a client still sending it (a long
    prompt; the load balancer forwarding one) met a reset on its next write (EPIPE here), which
    can reach it before the 503 and destroy it (RFC 9112 9.6). The rest of the body is now read
    and dropped before the close, for a second at most, as the protocol's own refusals are."""
    drain: dict[str, object] = {"drain_accept_s": 60.0, "drain_deadline_s": 60.0}
    with serve_process(tmp_path, {"server": drain}) as server:
        server.proc.send_signal(signal.SIGTERM)
        with httpx.Client(base_url=server.base_url, timeout=10.0) as client:
            _wait(lambda: client.get("/readyz").status_code == 503, "/readyz to fail")
        # Under max_body_bytes (1 MiB), and past what the edge reads and the kernel holds for it
        # unread (about 200 KiB): the client is still sending when the 503 is written.
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi " * 300_000}]})
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {server.key}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        port = int(server.base_url.rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # A small send buffer, as a client's on a real network: its body waits on the edge's reads.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
            sock.settimeout(30)
            sock.connect(("127.0.0.1", port))
            sock.sendall(head.encode() + body.encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=30) == 0
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 503 Service Unavailable", answer
    assert b"connection: close" in rest and b'"code":"server_shutting_down"' in rest, answer


def _started_stream(server: ServeProcess) -> _Stream:
    """A long stream (it never ends early) that has sent its first token."""
    stream = _Stream(server.base_url, server.auth(), BODY | {"ignore_eos": True})
    stream.start()
    assert stream.content.wait(60) and stream.error is None, stream.error
    return stream


def _usage_rows(config: Path) -> list[tuple[int, int]]:
    """(requests, output tokens) of each usage row the stopped server left in its store."""

    async def query() -> list[Any]:
        async with opened_usage(load_settings(config), creates=False) as store:
            return list(await store.query("drill-user", "", ""))

    return [(row.requests, row.output_tokens) for row in asyncio.run(query())]


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_second_signal_after_the_accept_window_cuts_the_streams_and_bills_them(
    tmp_path: Path, second: signal.Signals
) -> None:
    """Past drain_accept_s the listeners are closed and uvicorn waits for the streams: a second
    SIGTERM ends them now (each with its usage, error event and [DONE]), not at the drain deadline.
    A Ctrl-C there (as a `--workers` edge's workers get at a second Ctrl-C, passed on by their
    parent) was uvicorn's force exit: the app's shutdown skipped, and with it the usage row of the
    stream it had just cut (billed to no one), a KeyboardInterrupt traceback, a failing exit code.
    Now the same cut either way, its row written, exit 0."""
    drain = {"drain_accept_s": 0.5, "drain_deadline_s": 120.0}
    with serve_process(tmp_path, {"server": drain, "engine": {"max_num_seqs": 1}}) as server:
        stream = _started_stream(server)
        with children_held(server.proc.pid):  # the stream cannot finish by itself
            server.proc.send_signal(signal.SIGTERM)
            port = int(server.base_url.rsplit(":", 1)[1])
            _wait(lambda: not listening(port), "the accept window to end")
            server.proc.send_signal(second)
            stream.join(30)  # the deadline is 120 s away
            ended = not stream.is_alive()
        code = server.proc.wait(timeout=30)
        output = server.output()
    assert ended and stream.error is None, stream.error
    assert stream.events[-1] == DONE
    assert stream.events[-2]["error"]["code"] == "server_shutting_down"
    reply = stream.events[-3]["usage"]["completion_tokens"]
    assert code == 0 and "Traceback" not in output, output[-2000:]
    assert _usage_rows(tmp_path / "floodgate.toml") == [(1, reply)]


def test_a_hangup_drains_as_sigterm_does(tmp_path: Path) -> None:
    """SIGHUP (the terminal `floodgate serve` ran in, closed) killed the process outright: its
    streams reset with no error event or [DONE]. It drains now, as SIGTERM does."""
    drain = {"drain_accept_s": 0.2, "drain_deadline_s": 1.0}
    with serve_process(tmp_path, {"server": drain, "engine": {"max_num_seqs": 1}}) as server:
        stream = _started_stream(server)
        with children_held(server.proc.pid):  # the deadline finds the stream running
            server.proc.send_signal(signal.SIGHUP)
            stream.join(30)
            ended = not stream.is_alive()
        code = server.proc.wait(timeout=30)
    assert ended and stream.error is None, stream.error
    assert stream.events[-2]["error"]["code"] == "server_shutting_down"
    assert stream.events[-1] == DONE
    assert code == 0


def test_a_signal_after_the_cut_stops_waiting_for_a_stalled_client(tmp_path: Path) -> None:
    """Ctrl-C cuts the streams; a client stalled mid-body still held the exit until its body
    timeout, and nothing but SIGKILL could end the wait. A signal after the cut forces the exit
    now, and the app's shutdown still runs: the cut stream's usage row is written."""
    server_settings = {"drain_accept_s": 60.0, "drain_deadline_s": 120.0, "body_timeout_s": 120.0}
    sections = {"server": server_settings, "engine": {"max_num_seqs": 1}}
    with serve_process(tmp_path, sections) as server:
        stream = _Stream(server.base_url, server.auth(), BODY | {"ignore_eos": True})
        stream.start()
        assert stream.content.wait(60) and stream.error is None, stream.error
        port = int(server.base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled:
            head = (
                f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {server.key}\r\n"
            )
            stalled.sendall(f"{head}Content-Length: 100\r\n\r\n{{".encode())  # 99 bytes never come
            server.proc.send_signal(signal.SIGINT)
            stream.join(30)
            assert not stream.is_alive() and stream.events[-1] == DONE
            _wait(lambda: not listening(port), "the listener to close")
            server.proc.send_signal(signal.SIGINT)
            code = server.proc.wait(timeout=30)  # the body timeout is 120 s away
        output = server.output()
    reply = stream.events[-3]["usage"]["completion_tokens"]
    assert code == 0 and "Traceback" not in output, output[-2000:]
    assert _usage_rows(tmp_path / "floodgate.toml") == [(1, reply)]


def test_an_edge_started_under_nohup_serves_on_through_a_hangup(tmp_path: Path) -> None:
    """`nohup floodgate serve`: SIGHUP is ignored from the start, and the edge's own handler must not
    take that back (it drained and exited on the hangup nohup was there to survive)."""

    def ignore_hangups() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    with serve_process(tmp_path, {}, {"preexec_fn": ignore_hangups}) as server:
        # Still ignored once serving (the edge's handler was installed over it before it was ready).
        assert _ignored_signals(server.proc.pid) & (1 << (signal.SIGHUP - 1))
        server.proc.send_signal(signal.SIGHUP)
        with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
            # A whole request's Python runs after the signal: its handler, had it one, has run.
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            assert client.post(CHAT, json=body, headers=server.auth()).status_code == 200
            assert client.get("/readyz").status_code == 200
        assert server.proc.poll() is None


def test_a_second_hangup_does_not_cut_the_drain_the_first_began() -> None:
    """A closed terminal's shell and then its kernel each send SIGHUP, a millisecond apart (the
    review's real shell in a pty: 4 runs in 6): the second was taken for a second signal and cut the
    streams the first was draining. Ctrl-C still cuts."""
    server = DrainingServer(uvicorn.Config(app=None), Drain(accept_s=60.0, deadline_s=60.0))
    server.handle_exit(signal.SIGHUP, None)
    server.handle_exit(signal.SIGHUP, None)
    assert not server.should_exit and not server.force_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.should_exit and not server.force_exit


def test_a_closed_terminal_drains_the_edge_it_ran(tmp_path: Path) -> None:
    """`floodgate serve` in a terminal that closes: SIGHUP to its process group, and its standard
    streams dead. The drain's first log line failed there (EIO): the main loop died, exit 1, the
    running stream reset and never billed. Now the streams leave the terminal and the drain runs
    as on SIGTERM (the engine, in the same group, ignores the hangup and serves the drain)."""
    master, terminal = pty.openpty()
    stop_reading = threading.Event()
    reader = threading.Thread(target=_read_off, args=(master, stop_reading), daemon=True)
    reader.start()

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    drain = {"drain_accept_s": 0.2, "drain_deadline_s": 20.0}
    popen = {"stdin": terminal, "stdout": terminal, "stderr": terminal, "preexec_fn": own_terminal}
    with serve_process(tmp_path, {"server": drain}, popen) as server:
        os.close(terminal)
        stream = _Stream(server.base_url, server.auth(), BODY | {"ignore_eos": True})
        stream.start()
        assert stream.content.wait(60) and stream.error is None, stream.error
        stop_reading.set()
        reader.join()
        os.close(master)  # the window closes: the kernel hangs the terminal up
        stream.join(90)  # the deadline is 20 s away
        code = server.proc.wait(timeout=60)
    assert not stream.is_alive() and stream.error is None, stream.error
    assert stream.events[-1] == DONE
    # Ended by the drain's deadline or by itself (its engine generates on), its usage reported.
    (usage,) = [e["usage"] for e in stream.events if isinstance(e, dict) and e.get("usage")]
    assert code == 0
    assert _usage_rows(tmp_path / "floodgate.toml") == [(1, usage["completion_tokens"])]


def _ignored_signals(pid: int) -> int:
    """The process's ignored signals, as the kernel holds them (bit n-1 for signal n)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)


def _read_off(fd: int, stop: threading.Event) -> None:
    """Reads a terminal's output off, so the process writing to it never blocks on a full one, until
    `stop`: a read under way would hold the terminal open past the test's close of it."""
    with contextlib.suppress(OSError):
        while not stop.is_set():
            if select.select([fd], [], [], 0.05)[0] and not os.read(fd, 65536):
                return


def test_streams_cut_by_the_drain_give_everything_back(tmp_path: Path) -> None:
    """In process, so the dispatcher and the replica can be read after the cut: the listener keeps
    accepting for 60 s, the deadline comes after 1 s."""
    drain = {"server": {"drain_accept_s": 60.0, "drain_deadline_s": 1.0}}
    with start_server(tmp_path, drain) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
            body = BODY | {"seed": find_long_seed(client, server.keys["paid"])}
        before = idle_engine(server)
        drained = finished_requests(server, "drained")
        streams = [_Stream(server.base_url, server.auth("paid"), body) for _ in range(2)]
        for stream in streams:
            stream.start()
        for stream in streams:
            # Past its first token, not only its head: the engine has done work since `before`
            # (what the last check reads), which a loaded machine, both still in their prefill
            # when held, once had not (a fresh-clone CI run).
            assert stream.content.wait(60) and stream.error is None, stream.error
        # Hold the engine still, so the deadline finds both streams running on any machine (an idle
        # one generates their 1,000 tokens in about the deadline's second).
        with engines_held(server):
            server.drain()
            for stream in streams:
                stream.join(60)
                assert not stream.is_alive() and stream.error is None, stream.error
        for stream in streams:
            assert stream.events[-1] == DONE
            assert stream.events[-2]["error"]["code"] == "server_shutting_down"
            assert "usage" in stream.events[-3]  # before the error: the SDKs raise at it
        assert finished_requests(server, "drained") == drained + 2
        held = server.app.state.runtime.pipeline.dispatcher.replica_states()
        assert all(r.sequences_held == 0 and r.kv_tokens_held == 0 for r in held)
        after = wait_for_engine_to_drop(server, before)
        assert after.running == 0 and after.used_blocks == 0


def test_a_stream_the_server_cancels_on_exit_still_ends_with_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain stop (no drain) cancels what still runs after uvicorn's graceful timeout: here a
    stream queued behind a reader that never reads. It ends with an error event and [DONE], whose
    error object says when to retry as the drain's cut and its 503 do (`retry_after_ms`, the
    `Retry-After: 1` of a retry another instance takes): it said only "Please retry"."""
    settings = {
        "server": {"send_buffer_bytes": 4096, "stalled_reader_s": 600.0},
        "engine": {"max_num_seqs": 1},
    }
    server = start_server(tmp_path, settings)
    try:
        with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
            body = BODY | {"seed": find_long_seed(client, server.keys["paid"])}
        holder = open_and_never_read(server, body)
        wait_until(
            lambda: (
                sum(r.sequences_held for r in server.app.state.runtime.pipeline.dispatcher.replica_states())
                == 1
            ),
            30,
            "the reader that never reads to hold the only sequence",
        )
        queued = _Stream(server.base_url, server.auth("paid"), body)
        queued.start()
        assert queued.started.wait(60) and queued.error is None, queued.error
    finally:
        server.stop()
    queued.join(60)
    holder.close()
    assert queued.error is None, queued.error
    assert queued.events[-1] == DONE
    error = queued.events[-2]["error"]
    assert error["code"] == "server_shutting_down"
    assert error["retry_after_ms"] == 1000 and "should_retry" not in error
    assert "Exception in ASGI application" not in caplog.text


def test_streams_queued_at_sigterm_still_run_on_an_edge_in_the_fleet(tmp_path: Path) -> None:
    """With the Redis limiter the edge is a fleet member, and its drain hands its share of the
    replicas over to the others. Streams it had already accepted but still queued must run on that
    share until they end (here well before the deadline), not fail at once for want of a replica."""
    redis = start_redis()
    settings = {
        "server": {"drain_accept_s": 60.0, "drain_deadline_s": 60.0},
        "limiter": {"backend": "redis", "redis_url": redis.url, "timeout_ms": 2000},
        "engine": {"max_num_seqs": 1},
    }
    try:
        with start_server(tmp_path, settings) as server:
            dispatcher = server.app.state.runtime.pipeline.dispatcher
            with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
                long_body = BODY | {"seed": find_long_seed(client, server.keys["paid"])}
            # The first holds the replica's one sequence for LONG_TOKENS tokens; the others queue.
            streams = [_Stream(server.base_url, server.auth("paid"), long_body)]
            streams[0].start()
            assert streams[0].started.wait(60) and streams[0].error is None, streams[0].error
            streams += [
                _Stream(server.base_url, server.auth("paid"), BODY | {"max_tokens": 24}) for _ in range(2)
            ]
            for stream in streams[1:]:
                stream.start()
            _wait(lambda: dispatcher.queue_depth_per_replica() == 2, "both queued")
            server.drain()
            for stream in streams:
                stream.join(60)
                assert not stream.is_alive() and stream.error is None, stream.error
    finally:
        redis.kill()
    for stream in streams:
        data = [e for e in stream.events if isinstance(e, dict)]
        assert not [e["error"] for e in data if "error" in e]
        finals = [e for e in data if e.get("choices") and e["choices"][0]["finish_reason"]]
        assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] in ("stop", "length")
        assert stream.events[-1] == DONE


def test_the_operator_listener_answers_until_the_streams_have_ended(tmp_path: Path) -> None:
    """The accept window's end closed the operator listener with the public one: for the rest of
    the drain (streams finishing, up to drain_deadline_s) a liveness probe or a Prometheus scrape
    of the ops port met a refused connection, so an orchestrator could kill the edge mid-drain
    (cutting every stream the drain kept) and the drain's last metrics were never read. It now
    answers until the streams have ended: alive, not ready (`draining`), its metrics current. A
    scraper's keep-alive connection to it does not hold the exit."""
    drain: dict[str, object] = {"drain_accept_s": 0.5, "drain_deadline_s": 120.0}
    with serve_process(tmp_path, {"server": drain, "engine": {"max_num_seqs": 1}}) as server:
        stream = _started_stream(server)
        ops_port = int(server.ops_url.rsplit(":", 1)[1])
        with httpx.Client(base_url=server.ops_url, timeout=10.0) as scraper:
            assert scraper.get("/metrics").status_code == 200  # its connection kept alive
            with children_held(server.proc.pid):  # the stream cannot finish by itself
                server.proc.send_signal(signal.SIGTERM)
                port = int(server.base_url.rsplit(":", 1)[1])
                _wait(lambda: not listening(port), "the accept window to end")
                assert stream.is_alive()  # the drain still waits for it (the deadline is 120 s away)
                with httpx.Client(base_url=server.ops_url, timeout=10.0) as probe:
                    alive, ready = probe.get("/healthz"), probe.get("/readyz")
                metrics = scraper.get("/metrics")
                server.proc.send_signal(signal.SIGTERM)  # the second: cut the stream now
                stream.join(30)
                ended = not stream.is_alive()
            code = server.proc.wait(timeout=30)
        output = server.output()
    assert alive.status_code == 200 and alive.json() == {"status": "ok"}
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert metrics.status_code == 200 and "\nfloodgate_draining 1.0\n" in metrics.text
    assert ended and stream.error is None, stream.error
    assert stream.events[-1] == DONE
    assert code == 0 and "Traceback" not in output, output[-2000:]
    assert not listening(ops_port)


def test_the_operator_listeners_date_header_moves_on_while_the_streams_end(tmp_path: Path) -> None:
    """uvicorn refreshes the Date header it gives every answer at its ticks (once a second), which
    end with the accept window: the operator listener, open until the streams have ended (up to
    drain_deadline_s later), answered every probe and scrape meanwhile with the Date of that
    moment, frozen. It moves on with the clock now, as it does before the drain."""
    drain: dict[str, object] = {"drain_accept_s": 0.5, "drain_deadline_s": 120.0}
    with serve_process(tmp_path, {"server": drain, "engine": {"max_num_seqs": 1}}) as server:
        stream = _started_stream(server)
        with httpx.Client(base_url=server.ops_url, timeout=10.0) as probe, children_held(server.proc.pid):
            server.proc.send_signal(signal.SIGTERM)
            port = int(server.base_url.rsplit(":", 1)[1])
            _wait(lambda: not listening(port), "the accept window to end")
            assert stream.is_alive()  # the drain still waits for it (the deadline is 120 s away)
            first = probe.get("/healthz").headers["date"]
            # A second later by the clock the header changes; frozen, it never did.
            _wait(lambda: probe.get("/healthz").headers["date"] != first, "the Date header to move on", 10.0)
            server.proc.send_signal(signal.SIGTERM)  # the second: cut the stream now
            stream.join(30)
        assert server.proc.wait(timeout=30) == 0


class _HeldPages(SQLiteKeyStore):
    """A key store whose key listing, once `armed`, is held until the store is closed (a slow
    store): the admin request that asked for it is still running when the drain ends."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.armed = False
        self.held = threading.Event()
        self.closed = False
        self.used_after_close = False
        self._release: asyncio.Event | None = None

    async def page_keys(self, user: str | None, after: str | None, limit: int) -> KeyPage:
        if self.armed:
            self._release = asyncio.Event()
            self.held.set()
            await self._release.wait()
            self.used_after_close = self.closed
        return await super().page_keys(user, after, limit)

    async def aclose(self) -> None:
        self.closed = True
        if self._release is not None:
            self._release.set()
        await super().aclose()


def test_an_operator_request_past_the_grace_is_stopped_before_the_apps_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A request on the operator listener still running once the streams had ended and its grace
    (OPS_CLOSE_GRACE_S) was over had its connection cut, but ran on into the app's shutdown: on the
    key store, limiter and writers being closed (here its key store's listing went on after the
    store closed), and one still running at the loop's end was cancelled there, logging uvicorn's
    "Exception in ASGI application" traceback. It is cancelled with its connection now, quietly,
    before the app's shutdown begins."""
    stores: list[_HeldPages] = []

    async def open_key_store(config: KeysConfig, *, creates: bool) -> KeyStore:
        stores.append(_HeldPages(config.sqlite_path))
        return stores[-1]

    monkeypatch.setitem(vars(services), "open_key_store", open_key_store)
    admin_key = "fg-admin-ops-grace-test"
    server = start_server(tmp_path, {"keys": {"admin_key_sha256": hash_key(admin_key)}})
    store = stores[0]
    store.armed = True
    answers: list[httpx.Response | httpx.HTTPError] = []

    def list_keys() -> None:
        headers = {"Authorization": f"Bearer {admin_key}"}
        try:
            answers.append(httpx.get(server.ops_url + "/v1/admin/keys", headers=headers, timeout=30.0))
        except httpx.HTTPError as exc:
            answers.append(exc)

    asking = threading.Thread(target=list_keys, daemon=True)
    asking.start()
    assert store.held.wait(30)
    with capture_logs() as logs:
        server.drain()  # no stream runs: the operator listener closes at once
        server.wait_stopped()
    asking.join(30)
    logged = capfd.readouterr().err
    assert store.closed and not store.used_after_close
    assert len(answers) == 1 and isinstance(answers[0], httpx.TransportError), answers  # cut, no 500
    assert "Exception in ASGI application" not in logged and "Traceback" not in logged, logged[-3000:]
    assert [e["path"] for e in logs if e["event"] == "ops_request_cut_by_shutdown"] == ["/v1/admin/keys"]


def _unsent_bytes(server_port: int, client_port: int) -> int:
    """What the edge's socket of the connection from `client_port` holds unsent (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1].split(":")[1], fields[2].split(":")[1]
        if int(local, 16) == server_port and int(remote, 16) == client_port:
            return int(fields[4].split(":")[0], 16)
    return 0


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_forced_cut_does_not_wait_on_a_client_that_stopped_reading(
    tmp_path: Path, second: signal.Signals
) -> None:
    """A stream whose client stopped reading (its connection's buffers full), cut by a second
    signal: its last events could not be written, and the exit waited on that write until uvicorn's
    graceful timeout, the drain deadline (here 120 s away), though the cut was to end it now. Past
    the cut such a write gets a second, then the connection is dropped; the exit comes at once, and
    the app's shutdown writes the stream's usage row."""
    drain = {"drain_accept_s": 0.5, "drain_deadline_s": 120.0}
    # The stalled-reader watch would otherwise end the wait itself, 30 s on by default.
    server_settings = {**drain, "stalled_reader_s": 600.0, "send_buffer_bytes": 4096}
    with serve_process(tmp_path, {"server": server_settings}) as server:
        port = int(server.base_url.rsplit(":", 1)[1])
        body = BODY | {"max_tokens": 2000, "ignore_eos": True}  # far more than the buffers hold
        with open_stalled(server.base_url, server.key, body) as stalled:
            client_port = stalled.getsockname()[1]
            # The client's window closed: the edge's kernel holds what the client does not take.
            _wait(lambda: _unsent_bytes(port, client_port) > 0, "the client to stop taking the stream")
            server.proc.send_signal(signal.SIGTERM)
            _wait(lambda: not listening(port), "the accept window to end")
            server.proc.send_signal(second)
            try:
                code = server.proc.wait(timeout=30)  # the deadline is 120 s away
            except subprocess.TimeoutExpired:
                raise AssertionError(f"no exit 30 s after the cut: {server.output()[-4000:]}") from None
        output = server.output()
    assert code == 0 and "Traceback" not in output, output[-2000:]
    finished = [json.loads(line) for line in output.splitlines() if '"outcome"' in line]
    assert [line["outcome"] for line in finished] == ["drained"], finished
    assert _usage_rows(tmp_path / "floodgate.toml") == [(1, finished[0]["completion_tokens"])]


def test_a_drain_says_how_it_ended_when_it_is_over(tmp_path: Path) -> None:
    """The drain's log said when it began and, at its deadline, how many streams it cut, and nothing
    when it was over: an operator had to count every stream's line between SIGTERM and the exit to
    learn how many ended before the deadline, and to read timestamps for how long it took. Here
    one stream ends before the deadline (its client hangs up while the engine is held) and one is
    cut; `drain_finished` says both, and how long the drain ran."""
    drain = {"drain_accept_s": 0.2, "drain_deadline_s": 4.0}
    with serve_process(tmp_path, {"server": drain}) as server:
        cut = _Stream(server.base_url, server.auth(), BODY | {"ignore_eos": True})
        cut.start()
        assert cut.content.wait(60) and cut.error is None, cut.error
        with (
            httpx.Client(base_url=server.base_url, timeout=60.0) as client,
            client.stream("POST", CHAT, json=BODY | {"ignore_eos": True}, headers=server.auth()) as ends,
        ):
            stream = events(ends)  # kept: a dropped iterator closes the response
            first = next(stream)
            with children_held(server.proc.pid):
                server.proc.send_signal(signal.SIGTERM)
                _wait(lambda: "drain_started" in server.output(), "the drain to begin")
                ends.close()  # its client hangs up: the stream ends before the deadline
                ended = f'"request_id":"{first["request_id"]}"'
                _wait(lambda: ended in server.output(), "the hung-up stream's line")
                cut.join(60)
                assert not cut.is_alive() and cut.error is None, cut.error
        assert server.proc.wait(timeout=60) == 0
        records = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    (finished,) = [r for r in records if r["event"] == "drain_finished"]
    assert cut.events[-2]["error"]["code"] == "server_shutting_down"
    assert (finished["streams_ended"], finished["streams_cut"], finished["still_running"]) == (1, 1, 0), (
        finished
    )
    assert 4.0 <= finished["duration_s"] < 60, finished
    assert finished["level"] == "info", finished
