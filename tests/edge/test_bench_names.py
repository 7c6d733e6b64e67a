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


@pytest.mark.parametrize("argv", [["--paths", ""], ["--paths", "", "--baseline-code", "/tmp/base"]])
def test_triton_vs_local_takes_no_paths_beside_in_process(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--paths` names the paths beside in-process, so none is in-process alone (or beside the
    baseline checkout's Triton model): the empty name is dropped there, not refused as unknown."""
    import argparse

    from bench import triton_vs_local

    ran: list[argparse.Namespace] = []

    async def measure(args: argparse.Namespace) -> None:
        ran.append(args)

    monkeypatch.setattr(triton_vs_local, "main_async", measure)
    triton_vs_local.main(argv)
    assert [args.paths for args in ran] == [""]
