"""Cut streams whose client stopped reading.

A client that opens a stream and stops reading (a stalled proxy, a frozen tab, a slow-loris) would
otherwise hold its replica sequence, its KV blocks and its concurrency slot until the generation
ends. What it costs the edge meanwhile is bounded: the transport buffers at most its high-water
mark and then `send` waits (flow control), which stops the relay from pulling more tokens. Past
`[server] stalled_reader_s` of one send waiting with nothing taken by the client, the stream is cut
like a disconnect: the generation is aborted (its sequence and blocks freed), its lease settled,
its slot released.

Nothing taken, not merely waiting: a send waits until the buffer has drained from its high-water
mark to its low one (48 KiB), and a client reading steadily but slower than the replica generates
(a slow link) took longer than the limit to read that and was cut while it read. Where the server
tells how much the connection still buffers (edge/disconnect_watch.py), a scan that finds less of
it than the last one starts the stream's clock again.

One watch per process scans every open stream once a second: a timer per stream would cost a
wake-up per stream per second.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

import anyio
import structlog

from edge.metrics import STALLED_READERS_CUT
from edge.task_stop import stop_task

log = structlog.get_logger("floodgate.streaming")

SCAN_INTERVAL_S = 1.0


class SendProgress:
    """When this stream's pending send began, or the client last took some of its bytes during it
    (None: no send waiting), and whether its response has ended (its last write sent) or was cut.
    `buffered`: the bytes its connection holds unsent (None where the server does not tell, or
    the connection is gone)."""

    __slots__ = ("buffered", "cut", "ended", "request_id", "scope", "seen_buffered", "waiting_since")

    def __init__(
        self,
        request_id: str,
        scope: anyio.CancelScope,
        buffered: Callable[[], int | None] | None = None,
    ) -> None:
        self.request_id = request_id
        self.scope = scope
        self.buffered = buffered
        # What the last scan found buffered: less now is the client reading.
        self.seen_buffered: int | None = None
        self.waiting_since: float | None = None
        self.cut = False
        self.ended = False


class StalledReaders:
    def __init__(self, limit_s: float) -> None:
        if limit_s <= 0:
            raise ValueError("stalled_reader_s must be positive")
        self.limit_s = limit_s
        self._streams: set[SendProgress] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, progress: SendProgress) -> None:
        self._streams.add(progress)
        if self._task is None:
            # A context of its own, not the first watched stream's (its bound log fields).
            self._task = asyncio.create_task(
                self._scan_forever(), name="stalled-readers", context=contextvars.Context()
            )

    def unwatch(self, progress: SendProgress) -> None:
        self._streams.discard(progress)

    async def _scan_forever(self) -> None:
        loop = asyncio.get_running_loop()
        interval = min(SCAN_INTERVAL_S, self.limit_s / 2)
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            stalled_before = now - self.limit_s
            for progress in list(self._streams):
                if progress.waiting_since is not None and progress.buffered is not None:
                    buffered, seen = progress.buffered(), progress.seen_buffered
                    progress.seen_buffered = buffered
                    if buffered is not None and seen is not None and buffered < seen:
                        progress.waiting_since = now
                since = progress.waiting_since
                if since is not None and since < stalled_before and not progress.cut:
                    progress.cut = True
                    STALLED_READERS_CUT.inc()
                    log.warning("stalled_reader_cut", request_id=progress.request_id, limit_s=self.limit_s)
                    progress.scope.cancel()

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
