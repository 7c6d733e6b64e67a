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
