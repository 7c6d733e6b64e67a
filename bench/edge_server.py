"""Start a real `floodgate serve` in a subprocess for a benchmark, and read its CPU time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

BENCH_TIER = """
[limiter]
slot_ttl_s = 900

[tiers.bench]
priority = 10
requests_per_window = 100000000
request_window_s = 3600
tokens_per_window = 1000000000
token_window_s = 3600
max_concurrent = 100000
max_tokens = 4096
max_queue_wait_s = 600.0
on_store_failure = "open"
"""


@dataclass
class EdgeProcess:
    base_url: str
    key: str
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU of the edge process so far (all its threads, the engine's included)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def edge_process(extra_toml: str = "", triton: str | None = None) -> Iterator[EdgeProcess]:
    floodgate = [sys.executable, "-c", "from edge.cli import main; main()"]
    with tempfile.TemporaryDirectory(prefix="floodgate-bench-") as tmp:
        port = _free_port()
        config = Path(tmp) / "bench.toml"
        config.write_text(
            f'[server]\nport = {port}\n[keys]\nsqlite_path = "{tmp}/keys.db"\n'
            '[model]\nsource = "demo"\nname = "floodgate-tiny"\n'
            f'demo_dir = "{Path(".floodgate/demo-model").resolve()}"\n' + BENCH_TIER + extra_toml
        )
        key = subprocess.run(
            [*floodgate, "keys", "create", "--config", str(config), "--user", "bench", "--tier", "bench"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        cmd = [*floodgate, "serve", "--config", str(config)]
        if triton:
            cmd += ["--triton", triton]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "edge.log", "w"))
        base_url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"edge exited: {(Path(tmp) / 'edge.log').read_text()[-2000:]}")
                try:
                    if httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("edge did not become ready")
                time.sleep(0.2)
            yield EdgeProcess(base_url, key, proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
