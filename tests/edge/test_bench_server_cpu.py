"""The servers' CPU as bench.streams and bench.streams_setup read it (`Servers.cpu_ns`): every
thread the server ran between two readings counts, one that ended in between too, and a thread's
time before the first reading never comes off the figure. Summed over /proc/PID/task/*/schedstat,
a thread that ended between the readings took its whole life's CPU out of a set-up burst (a figure
below zero) and its time in a per-token window never counted."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.streams import Servers

# A thread burns 0.3 s of CPU and waits; told to go on, it ends, and a second thread burns 0.1 s
# and ends too: both end between the two readings around that line.
_SERVER = r"""
import sys, threading, time

def burn(seconds, burnt, then=None):
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    burnt.set()
    if then is not None:
        then.wait()

burnt, go_on = threading.Event(), threading.Event()
early = threading.Thread(target=burn, args=(0.3, burnt, go_on))
early.start()
burnt.wait()
print("burnt", flush=True)
sys.stdin.readline()
go_on.set()
early.join()
late = threading.Thread(target=burn, args=(0.1, threading.Event()))
late.start()
late.join()
print("ended", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def server() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "burnt\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_threads_that_end_between_two_readings_still_count(server: subprocess.Popen[str]) -> None:
    assert server.stdin is not None and server.stdout is not None
    servers = Servers("", "", [server.pid])
    before_ns, before_s = servers.cpu_ns(), servers.cpu_seconds()
    server.stdin.write("go on\n")
    server.stdin.flush()
    assert server.stdout.readline() == "ended\n"
    # The late thread's 0.1 s at least; the early one's 0.3 s before the first reading not taken off.
    assert servers.cpu_ns() - before_ns >= 100_000_000
    assert servers.cpu_seconds() - before_s >= 0.1
