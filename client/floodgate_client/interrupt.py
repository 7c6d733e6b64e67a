"""Ctrl-C during a streamed reply: the first asks the server to cancel, a second drops the connection."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TextIO

from floodgate_client.errors import FloodgateError


class CancelOnInterrupt:
    """While active (main thread only), the first SIGINT sends `cancel` and lets the stream run on, so
    it ends with the server's own cancelled chunk. The second raises KeyboardInterrupt as usual: the
    connection drops, which the server treats as a cancel too."""

    def __init__(self, cancel: Callable[[], object], err: TextIO) -> None:
        self.interrupted = False
        self._cancel = cancel
        self._err = err
        self._previous: Any = None

    def __enter__(self) -> CancelOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        # The handler runs between two steps of the reading loop; the cancel request must not block it.
        threading.Thread(target=self._send_cancel, name="floodgate-cancel", daemon=True).start()

    def _send_cancel(self) -> None:
        try:
            self._cancel()
        except FloodgateError as error:
            print(f"\n[cancel failed: {error.message}; Ctrl-C again to drop the connection]", file=self._err)
