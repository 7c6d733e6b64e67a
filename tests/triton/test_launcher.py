"""A tritonserver that cannot load its model fails the start with Triton's own error; the start
returns only once everything the edge reads answers; one that served requests stops cleanly on
SIGTERM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from edge.cancel.stream_close import aclose_stream
from edge.upstreams.base import GenerationRequest
from edge.upstreams.triton import TritonUpstream, build_triton_upstreams, end_token_ids
from gpu_container.engine.types import EngineConfig
from gpu_container.triton import launcher
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import (
    TritonProcess,
    TritonStartError,
    _loopback_ports,
    _wait_ready,
    start_local_triton,
)
from gpu_container.triton.server_group import ServerGroup
from tests.support.connections import established_to
from tests.support.live_server import demo_model_dir
from tests.support.triton_server import ENGINE_CONFIG, LocalTriton


def test_a_model_that_fails_to_load_fails_the_start(tmp_path: Path) -> None:
    repository = render_cpu_repository(tmp_path / "repo", tmp_path / "no-such-model", EngineConfig())
    with pytest.raises(TritonStartError) as failure:
        start_local_triton(repository)
    message = str(failure.value)
    assert "tritonserver exited" in message
    assert "failed to load 'tensorrt_llm'" in message
    assert "no-such-model" in message


@pytest.mark.anyio
async def test_a_server_that_served_requests_stops_on_sigterm_without_being_killed(tmp_path: Path) -> None:
    """SIGTERM unloads the model (its finalize stops the engine and the threads) and the server
    exits by itself, cleanly: stop() never falls back to killing it.

    The stop comes as soon as the metrics page says the replica is idle, as the edge's drain reads
    it. The page once went idle when the engine dropped a stopped request while its final response
    still waited to be sent, and a request shorter than the page's refresh never showed on it: a
    SIGTERM then came before that send, and tritonserver segfaulted in the unload (the backend had
    freed the request's response factory) or kept the model and exited 1, in 12 stops of 25. The
    page's periodic refresh is off here, so only what the model publishes as requests come and go
    is read."""
    model_dir = demo_model_dir()
    repository = render_cpu_repository(tmp_path / "repo", model_dir, ENGINE_CONFIG, metrics_period_ms=600_000)
    server = await anyio.to_thread.run_sync(start_local_triton, repository)
    try:
        eos = end_token_ids(model_dir)[0]
        upstream = TritonUpstream("triton-stop", server.http_url, server.metrics_url, end_id=-1, pad_id=eos)
        try:
            finished = [d async for d in upstream.generate(GenerationRequest("done", [11, 42, 7], 8))]
            assert finished[-1].finish_reason == "length"
            abandoned = upstream.generate(GenerationRequest("abandoned", [11, 42, 7], 1500))
            await abandoned.__anext__()
            # A request holding a token is on the page, however short its life.
            assert (await upstream.metrics()).active_requests == 1
            await aclose_stream(abandoned)
            assert await upstream.wait_idle(30)
        finally:
            await upstream.aclose()
        # Closed, not only scheduled to close: tritonserver waits for every HTTP connection it
        # sees at SIGTERM, and under load one still open then took its whole exit timeout.
        assert established_to(httpx.URL(server.http_url).port or 0) == 0
    finally:
        await anyio.to_thread.run_sync(server.stop)
    assert not server.killed, "tritonserver ignored SIGTERM and was killed"
    assert server.process.returncode == 0, server.exit_log


# A stand-in for tritonserver's start-up order, which a test cannot force on the real one:
# HTTP answers ready at once, the metrics listener opens only a little after the first probe.
_HTTP_BEFORE_METRICS = """
import http.server, sys, threading, time
http_port, metrics_port = int(sys.argv[1]), int(sys.argv[2])
probed = threading.Event()
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        probed.set()
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args): pass
ready = http.server.HTTPServer(("127.0.0.1", http_port), Ready)
threading.Thread(target=ready.serve_forever, daemon=True).start()
probed.wait()
time.sleep(0.3)
http.server.HTTPServer(("127.0.0.1", metrics_port), Ready).serve_forever()
"""


def test_the_ports_picked_for_one_server_are_never_the_same_port() -> None:
    """Picked one at a time, each socket closed before the next, the kernel could give one port
    twice: tritonserver's metrics service then failed on the port its HTTP service had taken."""
    for _ in range(300):
        ports = _loopback_ports(3)
        assert len(set(ports)) == 3, ports


def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the pick and tritonserver's bind (a second or two) another process's outgoing
    connection may draw a picked port as its source port: the start failed "already in use". Here
    the first pick's gRPC port is taken as that connection would take it."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real_pick = launcher._loopback_ports
    picks: list[list[int]] = []

    def pick(count: int) -> list[int]:
        ports = real_pick(count)
        if not picks:
            ports[0] = taken.getsockname()[1]
        picks.append(ports)
        return ports

    monkeypatch.setattr(launcher, "_loopback_ports", pick)
    repository = render_cpu_repository(tmp_path / "repo", demo_model_dir(), ENGINE_CONFIG)
    with taken:
        server = start_local_triton(repository)
    try:
        assert len(picks) == 2
        assert server.grpc_url == f"127.0.0.1:{picks[1][0]}"
        assert httpx.get(f"{server.http_url}/v2/health/ready", timeout=5).status_code == 200
    finally:
        server.stop()


def test_the_start_waits_for_the_metrics_page_as_well_as_readiness(tmp_path: Path) -> None:
    """The edge reads each replica's capacity from the metrics page the moment the server is up."""
    http_port, metrics_port = _loopback_ports(2)
    log_path = tmp_path / "server.log"
    process = subprocess.Popen(
        [sys.executable, "-c", _HTTP_BEFORE_METRICS, str(http_port), str(metrics_port)],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = TritonProcess(
        group=ServerGroup(process, shm_prefix=f"{tmp_path.name}_"),
        grpc_url="127.0.0.1:1",
        http_url=f"http://127.0.0.1:{http_port}",
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        log_path=log_path,
        workdir=tmp_path / "workdir",
    )
    try:
        _wait_ready(server, timeout_s=30)
        assert httpx.get(server.metrics_url, timeout=5).status_code == 200
    finally:
        process.kill()
        process.wait()


@pytest.mark.anyio
async def test_the_edges_local_triton_stops_cleanly_right_after_a_stream_was_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`serve --triton local` at shutdown: the drain has just cut a stream (its `stop` sent), and
    the model still owes that stream its final response. The stop waits for the replica's page to
    go idle before SIGTERM, or tritonserver crashes in the unload (see the test above)."""
    stopped: list[TritonProcess] = []
    real_stop = TritonProcess.stop

    def stop(self: TritonProcess) -> None:
        real_stop(self)
        stopped.append(self)

    monkeypatch.setattr(TritonProcess, "stop", stop)
    model_dir = demo_model_dir()
    upstreams, stop_local = await build_triton_upstreams(
        "local", model_dir, ENGINE_CONFIG, pad_id=end_token_ids(model_dir)[0]
    )
    try:
        cut = upstreams[0].generate(GenerationRequest("cut", [11, 42, 7], 1500))
        await cut.__anext__()
        await aclose_stream(cut)
    finally:
        await stop_local()
    [server] = stopped
    assert not server.killed
    assert server.process.returncode == 0, server.exit_log


def test_the_local_triton_runs_in_a_session_of_its_own(local_triton: LocalTriton) -> None:
    """A terminal's Ctrl-C or hangup signals the edge's process group; tritonserver, in it, died of
    a hangup mid-drain (every stream still running ended with upstream_error). The edge stops it."""
    pid = local_triton.process.process.pid
    assert os.getsid(pid) == pid != os.getsid(0)
    assert os.getpgid(pid) != os.getpgid(0)


def test_the_start_logs_the_spec_the_edge_takes(tmp_path: Path) -> None:
    """The start's log named the gRPC address alone: a replica started by hand and given to
    `floodgate serve --triton` by the port it showed stayed down (the edge speaks HTTP). It names
    the HTTP address and the `--triton` spec too."""
    repository = render_cpu_repository(tmp_path / "repo", demo_model_dir(), ENGINE_CONFIG)
    with capture_logs() as logs:
        server = start_local_triton(repository)
    try:
        ready = [line for line in logs if line["event"] == "tritonserver ready"]
        assert [line.get("replica_spec") for line in ready] == [server.replica_spec]
        assert [line.get("http") for line in ready] == [server.http_url]
    finally:
        server.stop()
