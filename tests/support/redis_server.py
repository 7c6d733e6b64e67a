"""Real redis-server processes for tests: a standalone server or a small Cluster, on free loopback
ports, with nothing persisted. Skips the calling test when no redis-server binary is installed.

    server = start_redis()              # server.url, server.port; server.stop() / server.kill()
    again = start_redis(server.port)    # a restart on the same port (after kill())
    cluster = start_redis_cluster(3)    # cluster.url (any node), cluster.nodes, cluster.stop()
    secure = start_redis(tls=files)     # TLS only (no plain port): a rediss:// url trusting files.ca
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.tls_files import TlsFiles

START_TIMEOUT_S = 10.0
_READY_LINE = "Ready to accept connections"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install redis-server, or `make system-deps`)")
    return path


@dataclass
class RedisServer:
    url: str
    port: int
    process: subprocess.Popen[str]
    workdir: Path
    tls: TlsFiles | None = None
    log: deque[str] = field(default_factory=lambda: deque(maxlen=200))

    def command(self, *words: str) -> bytes:
        """One command's raw reply, on a connection of its own (TLS where the server is)."""
        return _command(self.port, *words, tls=self.tls)

    def clients(self) -> list[dict[str, str]]:
        """CLIENT LIST: each connection's fields (name, cmd: its last command, ...)."""
        lines = self.command("CLIENT", "LIST").decode().split("\r\n")[1].splitlines()
        return [dict(field.split("=", 1) for field in line.split() if "=" in field) for line in lines]

    def stop(self) -> None:
        """Shut down cleanly (SIGTERM) and wait for the process to exit."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=START_TIMEOUT_S)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL: the server vanishes as in a crash; open connections see a reset."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=START_TIMEOUT_S)
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class RedisClusterServers:
    url: str
    nodes: list[RedisServer]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _drain(process: subprocess.Popen[str], log: deque[str], ready: threading.Event) -> None:
    # The server logs to stdout; reading it to the end keeps the pipe from filling up.
    assert process.stdout is not None
    for line in process.stdout:
        log.append(line.rstrip())
        if _READY_LINE in line:
            ready.set()


def start_redis(
    port: int | None = None,
    *,
    cluster: bool = False,
    tls: TlsFiles | None = None,
    extra_args: Sequence[str] = (),
) -> RedisServer:
    """Start redis-server on 127.0.0.1:`port` (a free one when None) and wait until it answers.
    With `tls` it listens for TLS only on that port (as ElastiCache with transit encryption
    "required" does), clients need no certificate of their own, and a Cluster's bus is TLS too."""
    if port is not None:
        return _start_redis(port, cluster, tls, extra_args)
    # Ports found free are free only until someone binds them: another test's server took one (its
    # port or its Cluster bus port) between free_port() and redis-server's bind now and then, over
    # a suite of hundreds of servers. Such a start is tried again on new ports.
    for _ in range(PORT_TRIES - 1):
        try:
            return _start_redis(free_port(), cluster, tls, extra_args)
        except PortTaken:
            continue
    return _start_redis(free_port(), cluster, tls, extra_args)


PORT_TRIES = 5


class PortTaken(RuntimeError):
    """redis-server could not bind a port chosen for it: someone took it first."""


def _start_redis(port: int, cluster: bool, tls: TlsFiles | None, extra_args: Sequence[str]) -> RedisServer:
    binary = _binary("redis-server")
    workdir = Path(tempfile.mkdtemp(prefix=f"redis-{port}-"))
    args = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(workdir), "--logfile", ""]
    if tls is None:
        args += ["--port", str(port)]
        url = f"redis://127.0.0.1:{port}/0"
    else:
        args += ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
        args += ["--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key)]
        args += ["--tls-ca-cert-file", str(tls.ca)]
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tls.ca}"
    if cluster:
        # An explicit bus port: the default (port + 10000) overflows for high ephemeral ports.
        args += ["--cluster-enabled", "yes", "--cluster-port", str(free_port())]
        args += ["--cluster-config-file", str(workdir / "nodes.conf")]
        if tls is not None:
            args += ["--tls-cluster", "yes"]
    args += list(extra_args)
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = RedisServer(url=url, port=port, process=process, workdir=workdir, tls=tls)
    ready = threading.Event()
    threading.Thread(target=_drain, args=(process, server.log, ready), daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or not _ping(port, tls):
        server.kill()
        taken = any("Address already in use" in line for line in server.log)
        raise (PortTaken if taken else RuntimeError)(
            f"redis-server on port {port} did not start:\n" + "\n".join(server.log)
        )
    return server


def _command(port: int, *words: str, tls: TlsFiles | None = None) -> bytes:
    request = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=START_TIMEOUT_S) as plain:
        sock = plain
        if tls is not None:
            sock = ssl.create_default_context(cafile=str(tls.ca)).wrap_socket(
                plain, server_hostname="127.0.0.1"
            )
        sock.sendall(request.encode())
        return sock.recv(65536)


def _ping(port: int, tls: TlsFiles | None = None) -> bool:
    """It answers: PONG, or NOAUTH from a server started with a password (--requirepass)."""
    reply = _command(port, "PING", tls=tls)
    return reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")


def _settled(node: RedisServer) -> bool:
    """The node sees the whole slot map served, and as a replica it is in sync with its primary."""
    if b"cluster_state:ok" not in node.command("CLUSTER", "INFO"):
        return False
    replication = node.command("INFO", "replication")
    return b"role:master" in replication or b"master_link_status:up" in replication


def start_redis_cluster(
    n: int = 3, *, tls: TlsFiles | None = None, replicas: int = 0, extra_args: Sequence[str] = ()
) -> RedisClusterServers:
    """Start `n` cluster-enabled servers (TLS only with `tls`), join them as primaries with
    `replicas` replicas each (redis-cli's choice of which), and wait until every node reports
    cluster_state:ok and every replica's link to its primary is up. `extra_args` go to every
    server (`--cluster-node-timeout 1000`: a lost primary is failed over within seconds)."""
    cli = _binary("redis-cli")
    nodes: list[RedisServer] = []
    tls_args = [] if tls is None else ["--tls", "--cacert", str(tls.ca)]
    try:
        for _ in range(n):
            nodes.append(start_redis(cluster=True, tls=tls, extra_args=extra_args))
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        create = ["--cluster", "create", *addresses, "--cluster-replicas", str(replicas), "--cluster-yes"]
        subprocess.run(
            [cli, *tls_args, *create],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT_S * 3,
        )
        deadline = time.monotonic() + START_TIMEOUT_S * 3
        # Gossip needs a moment to spread the slot map; poll the condition, bounded.
        while not all(_settled(node) for node in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("redis cluster did not reach cluster_state:ok")
            time.sleep(0.05)
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return RedisClusterServers(url=nodes[0].url, nodes=nodes)
