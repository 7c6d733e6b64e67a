"""A real `floodgate serve` process on loopback ports, for the drills that signal or overload it
(tests/faults/ and their long variants in bench/drills.py).

The process runs the demo model with the in-process engine; its output (stdout and stderr
together: the JSON log) goes to a file the drill reads after the process ends.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.free_ports import free_port
from edge.config import load_settings
from edge.keys.provision import create_keys

STARTUP_TIMEOUT_S = 60.0


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    base_url: str
    ops_url: str
    key: str  # a paid-tier key
    log_path: Path

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


@contextmanager
def serve_process(
    workdir: Path,
    sections: dict[str, dict[str, object]],
    demo_dir: Path,
    popen: dict[str, Any] | None = None,
) -> Iterator[ServeProcess]:
    """`floodgate serve` with `sections` over the drill defaults (the demo model in `demo_dir`,
    stores under `workdir`); killed if still running at the end. `popen`: more subprocess.Popen
    arguments (a terminal for its standard streams, a signal it starts ignoring)."""
    port, ops_port = free_port(), free_port()
    keys_file = workdir / "keys.jsonl"
    base: dict[str, dict[str, object]] = {
        "server": {"port": port, "ops_port": ops_port, "keys_file": str(keys_file), "dev_key": False},
        "model": {"source": "demo", "name": "floodgate-tiny", "demo_dir": str(demo_dir)},
        "messages": {"sqlite_path": str(workdir / "messages.db")},
        "keys": {"sqlite_path": str(workdir / "keys.db")},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    config = workdir / "floodgate.toml"
    config.write_text(
        "".join(
            f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
            for name, values in base.items()
        )
    )
    key = create_keys(load_settings(config), {"drill": ("drill-user", "paid")})["drill"]
    log_path = workdir / "serve.log"
    with log_path.open("wb") as log:
        options: dict[str, Any] = {"stdout": log, "stderr": subprocess.STDOUT, **(popen or {})}
        proc = subprocess.Popen(
            [sys.executable, "-m", "edge.cli", "serve", "--config", str(config)], cwd=workdir, **options
        )
    server = ServeProcess(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ops_port}", key, log_path)
    try:
        _wait_ready(server)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _wait_ready(server: ServeProcess) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    # One client for every poll: httpx.get builds a client, and its TLS context (the CA bundle
    # loaded, about 20 ms of CPU), each time, a core's fifth spent beside the starting server.
    with httpx.Client(base_url=server.base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f"floodgate serve exited during start-up:\n{server.output()}")
            try:
                if client.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            # Polling: the process offers no start-up event to wait on.
            time.sleep(0.05)
    raise TimeoutError(f"floodgate serve was not ready within {STARTUP_TIMEOUT_S}s:\n{server.output()}")
