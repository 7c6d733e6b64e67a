"""`python -m bench.limiter_paths`, run small: on each kind of Redis it starts (one server and a
3-node Cluster, plain and TLS-only) both paths make every decision, and it reports a row per Redis,
path and caller count, and a ratio row per Redis and caller count. A bench that no test runs rots
between sessions; its timings are for docs/, not for a pass or a fail here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KINDS = ("one server, plain", "one server, TLS", "3-node Cluster, plain", "3-node Cluster, TLS")


@pytest.mark.server
def test_the_limiter_paths_bench_decides_on_every_kind_of_redis(tmp_path: Path) -> None:
    out = tmp_path / "paths.md"
    args = ["--decisions", "80", "--concurrency", "4", "--rounds", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.limiter_paths", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    figures = [
        [cell.strip() for cell in row] for row in rows if row[1].strip() in ("own connections", "redis-py")
    ]
    assert {(r[0], r[1], r[2]) for r in figures} == {
        (kind, path, callers)
        for kind in KINDS
        for path in ("own connections", "redis-py")
        for callers in ("1", "4")
    }
    for row in figures:
        per_s, p50, p99, cpu = (float(cell.replace(",", "")) for cell in row[3:])
        assert per_s > 0 and 0 < p50 <= p99 and cpu > 0
    ratios = [row for row in rows if row[1].strip() in ("1", "4") and "x (" in row[2]]
    assert len(ratios) == len(KINDS) * 2
