"""Drill: ten times more concurrent streams than `floodgate serve` holds (`max_open_streams`).

Every client gets an HTTP answer, never a reset: 200 (a stream that ends with [DONE]) or a fast
429 with Retry-After. The process's memory stays bounded, and once the flood is over no slot,
sequence or KV block is left held.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.edge.sse_client import CHAT, DONE, MODEL
from tests.faults.serve_process import ServeProcess, serve_process

CAPACITY = 16
CLIENTS = 10 * CAPACITY
# The edge process's growth over the flood (its engine runs in a process of its own).
MEMORY_BOUND_BYTES = 100 * 2**20
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": True}
SETTINGS: dict[str, dict[str, object]] = {
    "server": {"max_open_streams": CAPACITY},
    "engine": {"max_num_seqs": 4},
    # One user sends the whole flood: the per-user limits must not be what turns it away.
    "tiers.paid": {"max_concurrent": 10_000, "requests_per_window": 100_000},
}


def _memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def _one(client: httpx.AsyncClient, headers: dict[str, str]) -> tuple[int, str | None, str | None]:
    """(status, retry-after, last data line)."""
    async with client.stream("POST", CHAT, json=BODY, headers=headers) as response:
        last = None
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                last = line.removeprefix("data: ")
        return response.status_code, response.headers.get("retry-after"), last


async def _flood(server: ServeProcess) -> list[tuple[int, str | None, str | None]]:
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0, limits=limits) as client:
        return await asyncio.gather(*(_one(client, server.auth()) for _ in range(CLIENTS)))


def _replicas(server: ServeProcess) -> list[dict[str, object]]:
    engine: list[dict[str, object]] = httpx.get(server.ops_url + "/v1/internal/engine", timeout=10).json()[
        "replicas"
    ]
    return engine


def test_ten_times_capacity_gets_only_200_and_429(tmp_path: Path) -> None:
    with serve_process(tmp_path, SETTINGS) as server:
        rss_before = _memory_kib(server.proc.pid, "VmRSS")
        answers = asyncio.run(_flood(server))
        peak = _memory_kib(server.proc.pid, "VmHWM")

        statuses = [status for status, _, _ in answers]
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(200) >= CAPACITY and statuses.count(429) > 0
        for status, retry_after, last in answers:
            if status == 200:
                assert last == DONE
            else:
                assert retry_after is not None and int(retry_after) >= 1
        assert (peak - rss_before) * 1024 < MEMORY_BOUND_BYTES

        # Nothing left held: the dispatcher's own count at once, the replica's at its next health poll.
        deadline = time.monotonic() + 30
        while True:
            replicas = _replicas(server)
            held = sum(int(str(r["sequences_held"])) for r in replicas)
            used = sum(int(str(r["kv_tokens_used"])) + int(str(r["running"])) for r in replicas)
            if held == 0 and used == 0:
                break
            assert time.monotonic() < deadline, f"still held after the flood: {replicas}"
            time.sleep(0.1)
