"""`python -m bench.ttft_overhead`, the issue-11 command for the edge's share of time to first token,
run small: the real edge on a redis-server of its own (and on a TLS-only Redis Cluster, production's
shape) streams every admit it measures, none fails,
and the figures it reports are consistent, where the time went inside the server too (`--phases`,
whose probe wraps edge functions by name and would rot silently as they move), and each stream's
client and server moments joined (one clock, the client's port). A bench that no test
runs rots between sessions; its timings themselves are for docs/, not for a pass or a fail here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _one_row(*args: str) -> dict[str, Any]:
    """The command's one row, its admits spread, run with `args`."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.ttft_overhead", *args, "--arrivals", "spread", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return row  # type: ignore[no-any-return]


@pytest.mark.server
@pytest.mark.parametrize("limiter", ["redis", "redis-cluster-tls"])
def test_the_ttft_bench_streams_every_admit_on_a_real_redis(limiter: str) -> None:
    row = _one_row(
        "--concurrency", "4", "--tokens", "3", "--duration", "1", "--limiters", limiter, "--phases"
    )
    assert (row["limiter"], row["arrivals"], row["errors"]) == (limiter, "spread", 0)
    assert row["admits"] > 4  # every client streamed more than once
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] <= row["ttft_max_ms"]
    assert row["server_cpu_us_per_admit"] > 0
    assert 0 <= row["server_system_us_per_admit"] <= row["server_cpu_us_per_admit"]
    phases = row["server_phases_ms"]
    assert phases["total"]["n"] >= row["admits"]  # the server saw every stream the client timed
    # Nested spans of each request: each one's quantiles lie under its container's.
    for inner, outer in (("limiter_admit", "pipeline_admit"), ("pipeline_admit", "route")):
        assert 0 < phases[inner]["p50"] <= phases[outer]["p50"]
        assert phases[inner]["max"] <= phases[outer]["max"]
    assert phases["total"]["p50"] <= row["ttft_p50_ms"]
    # Every admit's and settle's reply came over the limiter's own connections and was timed.
    assert phases["redis_reply"]["n"] > 0 and phases["redis_reply"]["p50"] > 0
    # Every stream the client timed was found in the server's records (its port, its moments), and
    # the parts are in the order they happen: the request read after the client began, the client's
    # read after the server's write. A join on the wrong stream, or two clocks, breaks these.
    parts = row["ttft_parts_ms"]
    for part in ("connect", "to_accept", "to_request", "server", "to_client"):
        assert parts[part]["n"] == row["admits"], part
    for part in ("connect", "to_request", "server", "to_client"):
        assert 0 <= parts[part]["p50"] <= parts[part]["p99"], part
    assert parts["server"]["p50"] <= phases["total"]["p99"]


@pytest.mark.server
def test_the_ttft_bench_on_two_workers_streams_every_admit_on_a_real_redis() -> None:
    """`--workers 2`: two edge servers on one port, fleet members on the limiter's Redis. Each must
    fill its own in-process replica whole (as serve's local engines): handed one they share, the
    second waited for a share and answered 503 no_replica meanwhile (459 of ~1,000 streams)."""
    row = _one_row(
        "--concurrency", "8", "--tokens", "3", "--duration", "2", "--limiters", "redis", "--workers", "2"
    )
    assert (row["workers"], row["limiter"], row["errors"]) == (2, "redis", 0)
    assert row["admits"] > 8


def _event(payload: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_CONTENT = _event(b'{"choices":[{"index":0,"delta":{"content":" The"}}]}')
# How a server's stream goes after its first content delta.
_ENDINGS = {
    "whole": _CONTENT + _event(b"[DONE]") + b"0\r\n\r\n",
    "error event": _event(b'{"error":{"code":"upstream_error"}}') + b"0\r\n\r\n",
    "cut short": b"",  # the connection closed with the body unfinished
}


@pytest.mark.parametrize("ending", list(_ENDINGS))
def test_a_stream_that_fails_after_its_first_token_is_an_error_not_an_admit(ending: str) -> None:
    """The TTFT bench counted a stream as admitted once its first content delta came: one that then
    got an error event, or whose connection closed mid-body, was an admit, and the row's errors
    (which fail the goal's view) stayed 0. A server answering every stream so is measured here."""
    import asyncio
    import os

    from bench.streams import Servers
    from bench.ttft_overhead import _load

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(_HEAD + _CONTENT + _ENDINGS[ending])
        await writer.drain()
        writer.close()

    async def main() -> dict[str, Any]:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await _load(
                Servers(f"http://127.0.0.1:{port}", "key", [os.getpid()]), 2, 2, 0.3, False, 0.01
            )

    row = asyncio.run(main())
    if ending == "whole":
        assert row["admits"] > 0 and row["errors"] == 0
    else:
        assert row["admits"] == 0 and row["errors"] > 0
        assert row["moments"] == []  # nor joined with the server's records as a stream timed
