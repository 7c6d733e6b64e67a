"""Bench flags that name things in a comma-separated list refuse a name they do not know before
anything runs (bench/names.py). Each of these ran on instead: the misspelt name served as the
default under its own label (ttft_overhead, streams, cold_burst, triton_vs_local) or a child's
traceback minutes in (triton_clients)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("module", "flag"),
    [
        ("bench.ttft_overhead", "--limiters"),
        ("bench.ttft_overhead", "--arrivals"),
        ("bench.ttft_overhead", "--connections"),
        ("bench.streams", "--upstream"),
        ("bench.streams", "--gc"),
        ("bench.cold_burst", "--paths"),
        ("bench.triton_vs_local", "--paths"),
        ("bench.triton_clients", "--clients"),
        # A misspelt variant: the ones before it measured, then its --serve child's usage error as
        # a RuntimeError traceback.
        ("bench.relay", "--variants"),
    ],
)
def test_a_misspelt_name_is_refused_before_anything_runs(module: str, flag: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", module, flag, "bogus-name"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout[-500:] + done.stderr[-500:]
    assert "unknown 'bogus-name'; known:" in done.stderr
