"""A live edge's engine processes held still (SIGSTOP): nothing they run advances until they are
let go, so a test can make a drain deadline, a store failure or a cut land mid-generation on any
machine, however fast it generates."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.live_server import LiveServer


@contextmanager
def engines_held(server: LiveServer) -> Iterator[Callable[[], None]]:
    """Stop every replica's engine process; they go on at the block's end, or earlier through the
    callable it gives (letting go twice is harmless)."""
    dispatcher = server.app.state.runtime.pipeline.dispatcher
    engines = [r.upstream.pid for r in dispatcher.replicas.members]
    assert engines and all(engines), "the replicas are not engine processes"

    def let_go() -> None:
        for pid in engines:
            os.kill(pid, signal.SIGCONT)

    for pid in engines:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield let_go
    finally:
        let_go()


def child_pids(pid: int) -> list[int]:
    """The child processes of `pid` (a `floodgate serve` process's: its engines), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    assert found, "the serve process has no engine process"
    return found


@contextmanager
def children_held(pid: int) -> Iterator[None]:
    """engines_held for a `floodgate serve` run as a process of its own: its children (its
    engines) stopped for the block, so its streams go nowhere by themselves."""
    engines = child_pids(pid)
    for child in engines:
        os.kill(child, signal.SIGSTOP)
    try:
        yield
    finally:
        for child in engines:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
