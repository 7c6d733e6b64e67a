"""A real redis-server for the benchmarks and drills: on a free loopback port, nothing persisted,
and the faults a drill needs (kill, restart on the same port, pause and resume).

The test suite keeps its own starter (tests/support/redis_server.py, which skips a test when the
binary is missing, where a benchmark exits with a message instead); the benchmarks that need a
Cluster or TLS (bench.limiter_paths, bench.ttft_overhead's redis-cluster-tls) borrow that one
rather than write a second.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from bench.free_ports import free_port

START_TIMEOUT_S = 10.0


@dataclass
class RedisProcess:
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, port: int | None = None, extra_args: tuple[str, ...] = ()) -> RedisProcess:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server)")
        port = port or free_port()
        workdir = Path(tempfile.mkdtemp(prefix="floodgate-bench-redis-"))
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        process = subprocess.Popen([*args, "--dir", str(workdir), *extra_args], stdout=subprocess.DEVNULL)
        server = cls(port, process, workdir)
        server._wait_ready()
        return server

    def _wait_ready(self) -> None:
        client = Redis(port=self.port, socket_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                try:
                    client.ping()
                    return
                except RedisConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.kill()
                        raise
                    time.sleep(0.02)  # a server still starting, bounded by the deadline
        finally:
            client.close()

    def restart(self) -> RedisProcess:
        """A new, empty server on the same port (after kill): what a crashed Redis comes back as."""
        return RedisProcess.start(self.port)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=START_TIMEOUT_S)
        shutil.rmtree(self.workdir, ignore_errors=True)
