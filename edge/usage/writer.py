"""Usage recording off the token path: `record` only queues; one task sums what is queued per
(user, model, day) and adds the sums to the store.

A clean shutdown writes everything queued (retrying while the store fails) before the app exits:
`aclose` waits for the queue without a deadline of its own, because usage is billing data. Only a
request recorded after `aclose` began, or a queue full for lack of a store, is dropped: counted
and logged."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict

import structlog

from edge.usage.metrics import USAGE_DROPPED, USAGE_ROWS_WRITTEN, USAGE_WRITE_RETRIES
from edge.usage.record import Usage, utc_day
from edge.usage.store import UsageStore

log = structlog.get_logger("floodgate.usage")

Key = tuple[str, str, str]  # user, model, day


class UsageWriter:
    def __init__(
        self, store: UsageStore, queue_size: int, *, base_backoff_s: float = 0.05, max_backoff_s: float = 2.0
    ) -> None:
        self._store = store
        self._queue: asyncio.Queue[Usage] = asyncio.Queue(maxsize=queue_size)
        self._base_backoff_s = base_backoff_s
        self._max_backoff_s = max_backoff_s
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

    def record(self, user: str, model: str, input_tokens: int, output_tokens: int) -> bool:
        """One settled request's charged tokens; False when it could not be queued."""
        usage = Usage(user, model, utc_day(), input_tokens, output_tokens, 1)
        if self._closed:
            return self._drop(usage, "closed")
        try:
            self._queue.put_nowait(usage)
        except asyncio.QueueFull:
            return self._drop(usage, "queue_full")
        return True

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="usage-writer")

    async def flush(self) -> None:
        """Wait until everything recorded so far is in the store."""
        await self._queue.join()

    async def aclose(self) -> None:
        self._closed = True
        if self._worker is not None:
            await self._queue.join()
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                for row in _summed(batch):
                    await self._write(row)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, row: Usage) -> None:
        """Retries until the store takes it: dropping it would under-bill."""
        attempt = 0
        while True:
            try:
                await self._store.add(row)
            except Exception as exc:
                attempt += 1
                USAGE_WRITE_RETRIES.inc()
                backoff = min(self._max_backoff_s, self._base_backoff_s * 2 ** min(attempt, 16))
                log.warning("usage_write_failed", user=row.user, attempt=attempt, error=repr(exc))
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            else:
                USAGE_ROWS_WRITTEN.inc()
                return

    def _drop(self, usage: Usage, reason: str) -> bool:
        USAGE_DROPPED.inc()
        log.warning(
            "usage_dropped",
            reason=reason,
            user=usage.user,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
        )
        return False


def _summed(batch: list[Usage]) -> list[Usage]:
    sums: dict[Key, list[int]] = defaultdict(lambda: [0, 0, 0])
    for u in batch:
        s = sums[(u.user, u.model, u.day)]
        s[0] += u.input_tokens
        s[1] += u.output_tokens
        s[2] += u.requests
    return [Usage(user, model, day, *counts) for (user, model, day), counts in sums.items()]
