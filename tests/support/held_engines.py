"""A live edge's engine processes held still (SIGSTOP): nothing they run advances until they are
let go, so a test can make a drain deadline, a store failure or a cut land mid-generation on any
machine, however fast it generates."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
