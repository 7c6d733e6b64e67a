"""`floodgate healthcheck` (Dockerfile.edge's HEALTHCHECK) against a real `floodgate serve`.

The image's probe asked http://127.0.0.1:8000/healthz: the public port, and 8000 whatever the
settings said. It now asks the operator listener the settings name, which answers through a drain
after the public listener has closed."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.edge.sse_client import CHAT, LONG_PROMPT, LONG_TOKENS, MODEL
from tests.faults.serve_process import ServeProcess, serve_process
from tests.support.held_engines import children_held
from tests.support.ports import free_port, listening

# The image's HEALTHCHECK (python -m edge.healthcheck), and the same probe as a `floodgate` command.
_IMAGE = ("edge.healthcheck",)
_CLI = ("edge.cli", "healthcheck")


def _healthcheck(config: Path, command: tuple[str, ...] = _IMAGE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _wait_closed(server: ServeProcess, port: int) -> None:
    """Until the public listener refuses connections (the accept window's end), bounded; the edge
    offers no event to wait on."""
    deadline = time.monotonic() + 30
    while listening(port):
        assert time.monotonic() < deadline, "the public listener never closed"
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(timeout=0.02)
            raise AssertionError(f"floodgate serve exited mid-drain:\n{server.output()[-2000:]}")


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


class _Stream(threading.Thread):
    """A long stream (ignore_eos) read to its end; `started` once its first event came."""

    def __init__(self, server: ServeProcess) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.started = threading.Event()

    def run(self) -> None:
        body = {
            "model": MODEL,
            "messages": LONG_PROMPT,
            "max_tokens": LONG_TOKENS,
            "stream": True,
            "ignore_eos": True,
        }
        with (
            httpx.Client(base_url=self.server.base_url, timeout=60.0) as client,
            client.stream("POST", CHAT, json=body, headers=self.server.auth()) as answer,
        ):
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    self.started.set()


def test_unhealthy_where_nothing_listens_saying_where_and_no_secret(tmp_path: Path) -> None:
    password = "hunter2-not-for-logs"
    ops_port = free_port()
    config = tmp_path / "edge.toml"
    config.write_text(
        f"[server]\nport = {free_port()}\nops_port = {ops_port}\n"
        f'[limiter]\nbackend = "redis"\nredis_url = "redis://:{password}@127.0.0.1:1/0"\n'
    )

    done = _healthcheck(config)

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and f"127.0.0.1:{ops_port}" in done.stderr, done.stderr
    assert password not in done.stderr


@pytest.mark.parametrize("command", [_IMAGE, _CLI])
@pytest.mark.parametrize("timeout", ["inf", "1e10"])
def test_a_timeout_no_socket_holds_is_a_usage_error_not_a_traceback(
    tmp_path: Path, command: tuple[str, ...], timeout: str
) -> None:
    """`--timeout inf` (or any wait past what a socket's timeout holds, about 9.2e9 s) passed the
    "more than 0" check, and the probe's connect ended in an OverflowError traceback ("timestamp out
    of range for platform time_t"). Refused as the flag is read, as a 0 or a nan is: one line."""
    config = tmp_path / "edge.toml"
    config.write_text(f"[server]\nport = {free_port()}\nops_port = {free_port()}\n")

    done = subprocess.run(
        [sys.executable, "-m", *command, "--config", str(config), "--timeout", timeout],
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    said = done.stderr.splitlines()[-1]
    assert said.endswith(f"error: argument --timeout: {timeout}: give at most 86400 seconds (a day)"), said


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_healthy_on_its_ports_and_through_a_drain_that_closed_the_public_port(tmp_path: Path) -> None:
    """Ports other than 8000 and 9464 (free ones), as the settings name them; then SIGTERM with a
    stream held, past the accept window: the public listener is closed (the image's old probe met a
    refused connection there), the edge still alive and draining, and healthy. Once it has exited,
    unhealthy."""
    drain: dict[str, object] = {"drain_accept_s": 0.5, "drain_deadline_s": 120.0}
    with serve_process(tmp_path, {"server": drain, "engine": {"max_num_seqs": 1}}) as server:
        config = tmp_path / "floodgate.toml"  # what serve_process wrote and serves
        port = _port(server.base_url)
        assert 8000 not in (port, _port(server.ops_url))
        serving = _healthcheck(config)
        serving_cli = _healthcheck(config, _CLI)

        stream = _Stream(server)
        stream.start()
        assert stream.started.wait(60)
        with children_held(server.proc.pid):
            server.proc.send_signal(signal.SIGTERM)
            _wait_closed(server, port)
            assert server.proc.poll() is None and stream.is_alive()  # draining: 120 s to the deadline
            draining = _healthcheck(config)
            server.proc.send_signal(signal.SIGTERM)  # the second: cut the stream now
            stream.join(30)
        assert server.proc.wait(timeout=30) == 0
    exited = _healthcheck(config)

    assert serving.returncode == 0, serving.stderr
    assert serving_cli.returncode == 0, serving_cli.stderr
    assert draining.returncode == 0, draining.stderr
    assert serving.stderr == draining.stderr == ""
    assert exited.returncode == 1 and "ops listener" in exited.stderr, exited.stderr
