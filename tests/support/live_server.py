"""A real Floodgate edge on a loopback port, for tests that talk HTTP to it.

    with start_server(tmp_path, {"tiers": {"free": {...}}}) as server:
        httpx.post(server.base_url + "/v1/chat/completions", headers=server.auth("paid"), json=...)

uvicorn (uvloop + httptools, edge/server.py's DrainingServer) runs
`create_app(load_settings(overrides=...))` in a thread with its own event loop, on two loopback
listeners like `floodgate serve`: the public API (`base_url`) and the operator endpoints (`ops_url`:
/metrics, /v1/internal/engine). The key store (one key per tier, plus a second free user "free2")
and the message database live under tmp_path; the demo model is built once into a cache shared by
every test (its directory name is a hash of the builder's source, so a changed builder gets a fresh
copy).

Others import the `live_server` fixture (one server per test) from here, e.g. in a conftest.py:
`from tests.support.live_server import live_server  # noqa: F401`.
"""

from __future__ import annotations

import asyncio
import faulthandler
import hashlib
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest
from litestar import Litestar

import gpu_container.engine.demo_corpus
import gpu_container.engine.demo_model
import gpu_container.engine.llama_config
from edge.app import create_app
from edge.config import Settings, load_settings
from edge.keys.provision import create_keys
from edge.messages.ids import MessageIdGenerator
from edge.server import DrainingServer, Listeners, bind_listeners, uvicorn_config
from edge.upstreams.local_pool import UpstreamProvider
from gpu_container.engine.model import MAX_KNEE_ROWS
from tests.support.ports import free_port

STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 30.0

_demo_lock = threading.Lock()


def demo_model_dir() -> Path:
    """The demo checkpoint, built at most once per builder version (and so once per session)."""
    digest = hashlib.sha256()
    for module in (
        gpu_container.engine.demo_model,
        gpu_container.engine.demo_corpus,
        gpu_container.engine.llama_config,
    ):
        digest.update(Path(module.__file__ or "").read_bytes())
    directory = Path(tempfile.gettempdir()) / "floodgate-test-cache" / f"demo-model-{digest.hexdigest()[:16]}"
    with _demo_lock:
        # build_demo_model is a no-op on a complete directory and safe against racing processes.
        return gpu_container.engine.demo_model.build_demo_model(directory)


# The GEMV/GEMM knee of every replica the tests start, in process and behind Triton alike.
PINNED_KNEE_ROWS = MAX_KNEE_ROWS


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merge(base[key], value)
        else:
            out[key] = value
    return out


@dataclass
class LiveServer:
    base_url: str
    keys: dict[str, str]  # tier name → key; "free2" is a second user on the free tier
    settings: Settings
    app: Litestar  # the app itself (same process): tests may look at its state, e.g. engine stats
    ops_url: str  # the operator listener: /metrics, /v1/internal/engine
    _server: _TracedServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)
    _listeners: Listeners = field(repr=False)

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def metrics_text(self) -> str:
        """The Prometheus page, from the operator listener."""
        return httpx.get(self.ops_url + "/metrics", timeout=30.0).text

    def rejected(self, status: int) -> float:
        """floodgate_requests_rejected_total for `status`, every code summed."""
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in self.metrics_text().splitlines()
            if line.startswith("floodgate_requests_rejected_total{") and f'status="{status}"' in line
        )

    def drain(self) -> None:
        """What SIGTERM does to `floodgate serve` (a thread cannot receive the signal)."""
        self._server.request_drain()

    def wait_stopped(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            # Where every thread and every task of the edge's loop is stuck, so that a hang in CI
            # explains itself.
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            loop = self._server.loop
            for task in asyncio.all_tasks(loop) if loop is not None else ():
                print(f"edge task {task!r}", file=sys.stderr)
                task.print_stack(file=sys.stderr)
            raise RuntimeError("the edge did not shut down in time")
        self._listeners.close()

    def stop(self) -> None:
        self._server.should_exit = True
        self.wait_stopped()

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _TracedServer(DrainingServer):
    """The edge's server, keeping its loop: a test that sees it hang can print the loop's tasks."""

    loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)


def start_server(
    tmp_path: Path,
    overrides: dict[str, Any] | None = None,
    upstreams: UpstreamProvider | Mapping[str, UpstreamProvider] | None = None,
    ready_when: Collection[str] = ("ready",),
    message_ids: MessageIdGenerator | None = None,
) -> LiveServer:
    """`upstreams` replaces the replicas the settings name (default: the in-process engines): one
    provider for every model, or one per model name ([models.*]). Returns once /readyz says one of
    `ready_when` ("unavailable" too: an edge started with no replica up, a scale from zero).
    `message_ids` makes its conversations' message ids (a clock of its own: create_app)."""
    port = free_port()
    base = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "ops_port": 0,
            "keys_file": str(tmp_path / "keys.jsonl"),
            # Tests stop their servers at once; a drain test sets its own.
            "drain_accept_s": 0.0,
            "drain_deadline_s": 0.0,
        },
        # The demo model, for speed (the default is the real one, tests/golden/ runs it).
        "model": {"source": "demo", "name": "floodgate-tiny", "demo_dir": str(demo_model_dir())},
        # Pinned, not measured at start: replies compared across the two paths must come out of the
        # same kernels (a projection of a few rows is GEMVs below the knee and one GEMM above it,
        # which round differently and flip the demo model's near-ties).
        "engine": {"gemv_knee_rows": PINNED_KNEE_ROWS},
        "messages": {"sqlite_path": str(tmp_path / "messages.db")},
        "keys": {"sqlite_path": str(tmp_path / "keys.db")},
        # With the redis limiter the edges count themselves; a joiner waits two beats (edge/membership/).
        "fleet": {"heartbeat_s": 0.25, "member_ttl_s": 1.0},
    }
    settings = load_settings(overrides=_merge(base, overrides or {}))
    wanted = {tier: (f"{tier}-user", tier) for tier in settings.tiers}
    if "free" in settings.tiers:
        wanted["free2"] = ("free-user-2", "free")
    keys = create_keys(settings, wanted)

    app = create_app(settings, upstreams, message_ids)
    listeners = bind_listeners(settings.server)
    try:
        app.state.ops_port = listeners.ops_port
        # The operator listener as `floodgate serve` holds it: open until the streams have ended.
        config = uvicorn_config(app, settings.server, max_connections=app.state.max_connections)
        server = _TracedServer(config, app.state.drain, ops=listeners.ops)
        thread = threading.Thread(
            target=server.run,
            kwargs={"sockets": [listeners.public]},
            name=f"edge-{port}",
            daemon=True,
        )
        thread.start()
        live = LiveServer(
            f"http://127.0.0.1:{settings.server.port}",
            keys,
            settings,
            app,
            f"http://127.0.0.1:{listeners.ops_port}",
            server,
            thread,
            listeners,
        )
        _wait_ready(live, ready_when)
    except BaseException:
        # Nothing else closes them: a server whose start-up failed left both ports bound and their
        # descriptors open in the test process for the rest of the run (uvicorn closes neither
        # socket it was given, and the failure's traceback, kept by pytest, holds them).
        listeners.close()
        raise
    return live


def _wait_ready(live: LiveServer, ready_when: Collection[str]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not live._thread.is_alive():
            raise RuntimeError("the edge exited during start-up (see the log above)")
        if live._server.started:
            response = httpx.get(live.base_url + "/readyz", timeout=5.0)
            if response.json()["status"] in ready_when:
                return
        # Polling: uvicorn offers no start-up event to wait on.
        time.sleep(0.02)
    live.stop()
    raise TimeoutError(f"the edge was not ready within {STARTUP_TIMEOUT_S}s")


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path) as server:
        yield server
