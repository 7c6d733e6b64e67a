"""The parent's end of an engine child's command pipe, whose writes never block their caller.

The edge writes "add" and "abort" from its event loop. A child that is alive but stuck (stopped, a
step that never returns, a deadlock) stops reading its commands; once the pipe's buffer (64 KiB on
Linux) was full, a blocking write froze the event loop itself -- every stream of every user, the
health checks, the metrics -- until the stall watch killed the child (120 s by default), and for
good where the kill never landed (a child stuck in the kernel), since the reader thread's restart
then waited for the same pipe.

Here the caller writes what the pipe takes at once; what it does not take, and every message after
it until all is written, goes to a backlog that a thread drains as the child reads again. A child
that keeps up, the common case, is written to directly: handing each message to a thread would cost
a GIL switch (up to the 5 ms switch interval) per request on the hot path.
Messages keep their order (an "abort" never overtakes its "add"). The frames are Connection's (a
big-endian length, then the pickle), which the child reads with Connection.recv.
A child that is gone fails the write (EPIPE): its commands are dropped, and the reader thread, which
reads its events, notices its death.
"""

from __future__ import annotations

import os
import select
import struct
import threading
from collections import deque
from multiprocessing.reduction import ForkingPickler
from typing import Any

# How often a drainer waiting for a child that reads nothing looks whether its pipe was closed: only
# a child that outlived its kill (stuck in the kernel) keeps its pipe open after it was replaced.
_CLOSED_POLL_MS = 1000


class CommandPipe:
    """Writes messages to a child's command pipe (`fd`, which it owns) without ever blocking."""

    def __init__(self, fd: int, name: str) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._name = name
        # Guards everything below; held only for non-blocking writes.
        self._lock = threading.Lock()
        # What the pipe has not taken yet, in order. Not empty exactly while a drainer runs.
        self._backlog: deque[memoryview] = deque()
        self._closed = False
        self._broken = False  # the child is gone: everything is dropped

    def send(self, message: tuple[Any, ...]) -> None:
        """Write `message`, or queue it behind what the child has not read yet."""
        frame = _frame(message)
        with self._lock:
            if self._closed or self._broken:
                return
            if self._backlog:  # behind what waits, never beside it
                self._backlog.append(frame)
                return
            try:
                written = os.write(self._fd, frame)
            except BlockingIOError:
                written = 0
            except OSError:
                self._broken = True
                return
            if written == len(frame):
                return
            self._backlog.append(frame[written:])
            threading.Thread(target=self._drain, name=f"{self._name}-commands", daemon=True).start()

    def close(self) -> None:
        """Drop what is not written and close the pipe (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._backlog:
                os.close(self._fd)
            # Else the drainer closes it: it may be polling the descriptor now, which another
            # thread's open could reuse once closed.

    @property
    def backlog(self) -> int:
        """Messages (or their rests) waiting for the child to read."""
        with self._lock:
            return len(self._backlog)

    def _drain(self) -> None:
        """The backlog's thread: writes it as the child reads, then ends."""
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)  # POLLERR comes too once the child is gone
        while True:
            poller.poll(_CLOSED_POLL_MS)
            with self._lock:
                if self._closed:
                    self._backlog.clear()
                    os.close(self._fd)
                    return
                try:
                    while self._backlog:
                        chunk = self._backlog[0]
                        written = os.write(self._fd, chunk)
                        if written < len(chunk):
                            self._backlog[0] = chunk[written:]
                        else:
                            self._backlog.popleft()
                except BlockingIOError:
                    continue
                except OSError:
                    self._broken = True
                    self._backlog.clear()
                    return
                return


def _frame(message: tuple[Any, ...]) -> memoryview:
    """`message` as Connection.send writes it: its pickle's length (4 bytes, big-endian; -1 and 8
    bytes past 2 GiB), then the pickle."""
    payload = ForkingPickler.dumps(message)
    size = len(payload)
    header = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!iQ", -1, size)
    return memoryview(b"".join((header, payload)))
