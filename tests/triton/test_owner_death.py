"""A tritonserver dies with the process that started it, even when that process is SIGKILLed and
no stop() runs: an edge killed that way must not leave its local Triton (ports, memory, the
model's stub processes) behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

START_TIMEOUT_S = 180.0
GONE_TIMEOUT_S = 30.0


def _alive(pid: int) -> bool:
    """Running (a zombie has ended: only its exit status waits for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive at the deadline (polled: a process's end is no event we can wait on)."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _read_triton_pid(owner: subprocess.Popen[str]) -> int:
    """Blocks until the owner's server is ready, or the owner ended without one."""
    assert owner.stdout is not None
    for line in owner.stdout:  # the owner's log lines come first
        if line.startswith("triton_pid="):
            return int(line.removeprefix("triton_pid="))
    raise AssertionError(f"the owner did not start tritonserver (exit {owner.wait()})")


def test_a_sigkilled_owner_takes_its_tritonserver_along(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.triton.triton_owner", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    triton_pid, stubs = 0, list[int]()
    try:
        triton_pid = _read_triton_pid(owner)
        stubs = _children(triton_pid)
        assert _alive(triton_pid) and stubs, "tritonserver and its model's stub should be running"

        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=START_TIMEOUT_S)

        assert _wait_gone([triton_pid], GONE_TIMEOUT_S) == [], "tritonserver outlived its owner"
        assert _wait_gone(stubs, GONE_TIMEOUT_S) == [], "the model's stub outlived tritonserver"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for pid in [*stubs, triton_pid]:
            if pid and _alive(pid):  # a failed run leaves nothing behind
                os.kill(pid, signal.SIGKILL)
