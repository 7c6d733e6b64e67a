"""Served tokens/s: a real `floodgate serve` on loopback with the model under test, driven by
closed-loop streaming clients (aiohttp), and the resident memory of its processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.edge_server import BENCH_TIER, wait_ready
from bench.free_ports import free_port

FLOODGATE = [sys.executable, "-c", "from edge.cli import main; main()"]


@dataclass(frozen=True)
class Served:
    base_url: str
    key: str
    pid: int
    model_name: str

    def engine_pids(self) -> list[int]:
        """The edge's child processes (the engine processes, with isolation = "process")."""
        children: list[int] = []
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            text = (task / "children").read_text().split()
            children += [int(pid) for pid in text]
        return children


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB: resident now, and the peak."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


@contextmanager
def serve(model_dir: Path, model_name: str, engine_toml: str) -> Iterator[Served]:
    with tempfile.TemporaryDirectory(prefix="floodgate-bench-engine-") as tmp:
        port = free_port()
        config = Path(tmp) / "bench.toml"
        config.write_text(
            f'[server]\nport = {port}\nops_port = {free_port()}\n[keys]\nsqlite_path = "{tmp}/keys.db"\n'
            f'[model]\npath = "{model_dir.resolve()}"\nname = "{model_name}"\n'
            f"[engine]\n{engine_toml}\n" + BENCH_TIER
        )
        key = subprocess.run(
            [*FLOODGATE, "keys", "create", "--config", str(config), "--user", "bench", "--tier", "bench"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        log = Path(tmp) / "edge.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [*FLOODGATE, "serve", "--config", str(config)], stdout=subprocess.DEVNULL, stderr=sink
            )
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(proc, base_url, log, 300)
            yield Served(base_url, key, proc.pid, model_name)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _one(
    session: aiohttp.ClientSession, served: Served, messages: list[dict[str, str]], max_tokens: int
) -> int:
    body = {
        "model": served.model_name,
        "messages": messages,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {served.key}"}
    async with session.post(f"{served.base_url}/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        tokens = 0
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
        return tokens


async def closed_loop(
    served: Served, messages: list[dict[str, str]], streams: int, max_tokens: int, requests: int
) -> tuple[int, float]:
    """`streams` requests always in flight until `requests` were served: (tokens, seconds)."""
    remaining = list(range(requests))
    total = 0
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:

        async def worker() -> None:
            nonlocal total
            while remaining:
                remaining.pop()
                tokens = await _one(session, served, messages, max_tokens)
                total += tokens  # after the await: `total += await ...` reads total before it

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - start
    return total, wall
