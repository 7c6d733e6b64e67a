"""Start a real `tritonserver` on loopback from the binary the `nvidia-pytriton` wheel carries.

Only the binary, its libraries and the Python backend are taken from the wheel: PyTriton's own
serving layer never passes cancellation to the model, so we run the server directly.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import httpx
import structlog

from gpu_container.triton.server_group import ServerGroup
from gpu_container.triton.tied_child import popen_tied

log = structlog.get_logger(__name__)

READY_TIMEOUT_S = 120.0
# How long tritonserver itself waits, after SIGTERM, for in-flight requests and for its models to
# unload before it exits anyway. Its default (30 s) outlasts STOP_TIMEOUT_S; a server here is only
# stopped once its edge has drained, and a model that never unloads must not cost more than this.
EXIT_TIMEOUT_S = 5
STOP_TIMEOUT_S = 20.0


class TritonStartError(RuntimeError):
    """tritonserver exited or never became ready; the message carries the tail of its log."""


def _wheel_root() -> Path:
    import pytriton

    return Path(pytriton.__file__).parent


def _server_dir() -> Path:
    return _wheel_root() / "tritonserver"


def _loopback_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports, their sockets held open together while they are picked.
    Picked one at a time (each socket closed before the next was bound), the kernel could hand the
    same port back: tritonserver started its HTTP service, then failed to start its metrics service
    on the same port ("already in use"), a fresh-clone CI run's error."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def make_backend_directory(dest: Path) -> Path:
    """A backends/ folder holding the wheel's Python backend and the stub for this interpreter."""
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    source = _server_dir() / "backends" / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(source / name, python_dir / name)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = _server_dir() / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonStartError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version}")
    shutil.copy2(stub, python_dir / "triton_python_backend_stub")
    return dest


def server_environment() -> dict[str, str]:
    """The Python backend stub links against this interpreter's libpython: it needs its LIBDIR."""
    env = dict(os.environ)
    libdirs = [str(sysconfig.get_config_var("LIBDIR")), str(_wheel_root().parent / "nvidia_pytriton.libs")]
    if env.get("LD_LIBRARY_PATH"):
        libdirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libdirs)
    return env


@dataclass(eq=False)
class TritonProcess:
    """A running tritonserver; `stop()` sends SIGTERM and waits for it to drain and exit."""

    # Reaps the server once it exits, after ending its stubs: poll it through `group`, not `process`.
    group: ServerGroup
    grpc_url: str
    http_url: str
    metrics_url: str
    log_path: Path
    workdir: Path
    # Set by stop(): the server ignored SIGTERM for STOP_TIMEOUT_S and was killed.
    killed: bool = False
    # Set by stop() when the server did not exit cleanly: its whole log (the workdir is removed).
    exit_log: str | None = None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.group.process

    @property
    def replica_spec(self) -> str:
        """`HOST:HTTP_PORT:METRICS_PORT`, how `floodgate serve --triton` names this server."""
        http = urlsplit(self.http_url)
        return f"{http.hostname}:{http.port}:{urlsplit(self.metrics_url).port}"

    def log_summary(self, tail_chars: int = 2000) -> str:
        """Triton's error lines (`E<date> ...`: start-up tables often bury them), then the tail."""
        text = self.log_path.read_text(errors="replace")
        errors = [line[:2000] for line in text.splitlines() if line[:1] == "E" and line[1:5].isdigit()]
        return "\n".join([*errors[-20:], "...", text[-tail_chars:]])

    def stop(self) -> None:
        _running.discard(self)
        if self.group.alive:
            self.group.send_signal(signal.SIGTERM)
            if not self.group.wait(STOP_TIMEOUT_S):
                log.warning(
                    "tritonserver ignored SIGTERM, killing", pid=self.process.pid, log=self.log_summary()
                )
                self.killed = True
                self.group.send_signal(signal.SIGKILL)
            elif self.process.returncode != 0:
                self.exit_log = self.log_path.read_text(errors="replace")
                log.warning(
                    "tritonserver did not stop cleanly",
                    returncode=self.process.returncode,
                    log=self.log_summary(),
                )
        # Also when it had exited on its own (or a caller killed and reaped it): its stubs and
        # their shared memory are gone once this returns.
        self.group.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


# Servers this process started and has not stopped: stopped at interpreter exit if still running.
_running: set[TritonProcess] = set()


@atexit.register
def _stop_leftovers() -> None:
    for proc in list(_running):
        proc.stop()


def _wait_ready(proc: TritonProcess, timeout_s: float) -> None:
    """Until the server is ready and its metrics page answers too: tritonserver starts its metrics
    listener after its HTTP one, and an edge reading the page in that gap (it reads each replica's
    capacity there) took the replica for dead until its next health poll."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not proc.group.alive:
                proc.group.wait()
                code = proc.process.returncode
                raise TritonStartError(f"tritonserver exited with {code}:\n{proc.log_summary()}")
            try:
                if (
                    client.get(f"{proc.http_url}/v2/health/ready").status_code == 200
                    and client.get(proc.metrics_url).status_code == 200
                ):
                    return
            except httpx.TransportError:
                pass
            # Polling a child process's HTTP port: there is no event to wait on.
            time.sleep(0.1)
    raise TritonStartError(f"tritonserver not ready after {timeout_s:.0f} s:\n{proc.log_summary()}")


def start_local_triton(
    model_repository: Path,
    *,
    grpc_port: int | None = None,
    http_port: int | None = None,
    metrics_port: int | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> TritonProcess:
    """Start tritonserver on 127.0.0.1 over `model_repository` and return once it is ready.

    Ports not given are picked free, but only free when picked: tritonserver binds them a second or
    two later, and meanwhile any process's outgoing connection may draw one as its source port (the
    kernel hands both out from the same ephemeral range). A start that fails on a port it picked
    ("Socket ... already in use") is tried again on new ones; a port the caller named is theirs."""
    picks_some = None in (grpc_port, http_port, metrics_port)
    for _ in range(_PORT_ATTEMPTS - 1 if picks_some else 0):
        try:
            return _start(model_repository, grpc_port, http_port, metrics_port, ready_timeout_s)
        except TritonStartError as exc:
            if _PORT_TAKEN not in str(exc):
                raise
            log.warning("tritonserver lost a port picked for it to another process; starting again")
    return _start(model_repository, grpc_port, http_port, metrics_port, ready_timeout_s)


# How tritonserver says a port it was to bind is taken (its gRPC, HTTP and metrics services alike).
_PORT_TAKEN = "' already in use"
_PORT_ATTEMPTS = 3


def _start(
    model_repository: Path,
    grpc_port: int | None,
    http_port: int | None,
    metrics_port: int | None,
    ready_timeout_s: float,
) -> TritonProcess:
    picked = iter(_loopback_ports(3))
    grpc_port = grpc_port or next(picked)
    http_port = http_port or next(picked)
    metrics_port = metrics_port or next(picked)
    workdir = Path(tempfile.mkdtemp(prefix="floodgate-triton-"))
    backends = make_backend_directory(workdir / "backends")
    log_path = workdir / "tritonserver.log"
    # Its own, so that its stubs' shared-memory regions can be told from any other server's.
    shm_prefix = f"{workdir.name}_"
    command = [
        str(_server_dir() / "bin" / "tritonserver"),
        f"--model-repository={model_repository}",
        f"--backend-directory={backends}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        "--exit-on-error=true",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        "--log-verbose=0",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
    ]
    log_file: IO[bytes] = log_path.open("wb")
    with log_file:
        # Tied to this process: an owner that dies without stopping it (SIGKILL) takes it along. In
        # a session of its own: a terminal's Ctrl-C or hangup reaches the owner's process group
        # alone, and the owner stops it after its drain (a hangup killed it mid-drain: every stream
        # still running ended with upstream_error).
        process = popen_tied(
            command,
            env=server_environment(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
        )
    proc = TritonProcess(
        group=ServerGroup(process, shm_prefix),
        grpc_url=f"127.0.0.1:{grpc_port}",
        http_url=f"http://127.0.0.1:{http_port}",
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        log_path=log_path,
        workdir=workdir,
    )
    _running.add(proc)
    log.info("tritonserver starting", pid=process.pid, grpc=proc.grpc_url, repository=str(model_repository))
    try:
        _wait_ready(proc, ready_timeout_s)
    except BaseException:
        proc.stop()
        raise
    # The spec `floodgate serve --triton` takes (its HTTP port, not the gRPC one logged above).
    log.info("tritonserver ready", pid=process.pid, http=proc.http_url, replica_spec=proc.replica_spec)
    return proc
