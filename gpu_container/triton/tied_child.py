"""Child processes that die with the process that started them, however it ends (SIGKILL too).

A local tritonserver outlived an edge that was SIGKILLed (its atexit stop never ran): reparented to
init, it kept its ports, its memory and its model's stub processes. Linux's PR_SET_PDEATHSIG has the
kernel signal the child when its parent dies, set in the child between fork and exec.

The kernel means the parent *thread*: a child started from a worker thread (the edge starts
tritonserver through anyio.to_thread, whose idle threads exit) would be signalled when that thread
ends. So every tied child is started from one daemon thread kept for the life of the process.
Elsewhere than Linux the child is started plainly (not tied).
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_PR_SET_PDEATHSIG = 1

_Job = tuple[Callable[[], "subprocess.Popen[bytes]"], "Future[subprocess.Popen[bytes]]"]
_jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def popen_tied(
    args: list[str], *, death_signal: signal.Signals = signal.SIGKILL, **kwargs: Any
) -> subprocess.Popen[bytes]:
    """subprocess.Popen(args, **kwargs), whose child gets `death_signal` when this process dies."""
    if not sys.platform.startswith("linux"):
        return subprocess.Popen(args, **kwargs)
    preexec = _die_with(os.getpid(), death_signal)
    done: Future[subprocess.Popen[bytes]] = Future()
    _jobs.put((lambda: subprocess.Popen(args, preexec_fn=preexec, **kwargs), done))
    _ensure_spawner()
    return done.result()


def _die_with(parent_pid: int, death_signal: signal.Signals) -> Callable[[], None]:
    # Resolved before the fork: between fork and exec the child should only make the calls.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    kill, getppid, getpid = os.kill, os.getppid, os.getpid

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if getppid() != parent_pid:  # the parent died before the prctl took effect
            kill(getpid(), death_signal)

    return preexec


def _ensure_spawner() -> None:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            # A daemon thread: never joined, so it ends only with the process itself.
            _spawner = threading.Thread(target=_spawn_forever, name="tied-child-spawner", daemon=True)
            _spawner.start()


def _spawn_forever() -> None:
    while True:
        start, done = _jobs.get()
        try:
            done.set_result(start())
        except BaseException as exc:  # the caller re-raises it
            done.set_exception(exc)
