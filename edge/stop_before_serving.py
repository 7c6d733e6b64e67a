"""SIGTERM while `floodgate serve` starts: a stop, at once, exit 0.

Until the server's own handlers are in place (edge/server.py's drain, edge/workers.py's
supervisor), SIGTERM had Python's default action. In a container the edge is PID 1 (the image's
start script execs it, and a container runs no init unless asked: `docker run` without `--init`,
an ECS task without initProcessEnabled, which iac/ now sets), and the kernel drops every signal
PID 1 has no handler for: a task stopped while it started (a deployment rolled back, a scale-in right after
a scale-out) ignored its SIGTERM, went on to report ready and serve, and was SIGKILLed at the
task's stopTimeout, 120 s later. Outside a container it died by the signal (exit 143), where a
stop asked for while the workers start is no failure (exit 0, edge/workers.py).

So from the start of `serve` SIGTERM raises `StoppedBeforeServing` wherever the start-up is (the
model's import, the app's making), as Ctrl-C raises KeyboardInterrupt there, and the cleanups on
the way run. The server's handlers take over for as long as it runs (uvicorn's, or the workers'
supervisor's); once `serve` is done a SIGTERM has nothing left to stop and changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class StoppedBeforeServing(BaseException):
    """SIGTERM came before the edge served. A BaseException, as KeyboardInterrupt is: no `except
    Exception` on the start-up's way takes it for a failure of its own."""


def _stop(sig: int, frame: FrameType | None) -> None:
    raise StoppedBeforeServing


def _nothing_left(sig: int, frame: FrameType | None) -> None:
    """A SIGTERM once `serve` is done (a supervisor's late one): the edge has stopped already."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises StoppedBeforeServing inside this block wherever no server's own handler is in
    place; after it, SIGTERM is ignored."""
    signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, _nothing_left)
