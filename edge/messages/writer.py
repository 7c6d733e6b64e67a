"""Message persistence off the hot path: a bounded queue drained by one background task."""

from __future__ import annotations

import asyncio
import contextlib
import random

import structlog

from edge.messages.message import StoredMessage
from edge.messages.metrics import MESSAGE_WRITE_RETRIES, MESSAGES_DROPPED, MESSAGES_FAILED, MESSAGES_WRITTEN
from edge.messages.store import MessageRefused, MessageStore
from edge.task_stop import stop_task

log = structlog.get_logger(__name__)


class MessageWriter:
    """`submit` never waits: a request stream must not slow down because the store is slow, so a full
    queue drops the message (counted and logged) instead. The worker retries a failed write with
    jittered exponential backoff before giving up on that message."""

    def __init__(
        self,
        store: MessageStore,
        queue_size: int,
        *,
        max_attempts: int = 5,
        base_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        drain_timeout_s: float = 5.0,
    ) -> None:
        self._store = store
        self._queue: asyncio.Queue[StoredMessage] = asyncio.Queue(maxsize=queue_size)
        self._max_attempts = max_attempts
        self._base_backoff_s = base_backoff_s
        self._max_backoff_s = max_backoff_s
        self._drain_timeout_s = drain_timeout_s
        self._worker: asyncio.Task[None] | None = None
        self._writing: StoredMessage | None = None
        self._closed = False

    def submit(self, msg: StoredMessage) -> bool:
        """Queue a message for writing; False when it was dropped (queue full or writer closed)."""
        if self._closed:
            self._drop(msg, "closed")
            return False
        try:
            self._queue.put_nowait(msg)
        except asyncio.QueueFull:
            self._drop(msg, "queue_full")
            return False
        return True

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="message-writer")

    async def aclose(self) -> None:
        """Stop taking messages, write what is queued for at most `drain_timeout_s`, drop the rest."""
        self._closed = True
        in_flight = False
        if self._worker is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), self._drain_timeout_s)
            in_flight = self._writing is not None
            await stop_task(self._worker)
            self._worker = None
        left = self._queue.qsize() + in_flight
        if left:
            MESSAGES_DROPPED.inc(left)
            log.warning("message_writer_drain_incomplete", dropped=left)

    async def _run(self) -> None:
        while True:
            self._writing = await self._queue.get()
            try:
                await self._write(self._writing)
            finally:
                self._writing = None
                self._queue.task_done()

    async def _write(self, msg: StoredMessage) -> None:
        for attempt in range(1, self._max_attempts + 1):
            try:
                await self._store.append(msg)
            except Exception as exc:
                # A refused message is given up at once: retried, it would fail the same way while
                # every message queued behind it waited.
                if attempt == self._max_attempts or isinstance(exc, MessageRefused):
                    MESSAGES_FAILED.inc()
                    log.error(
                        "message_write_failed",
                        conversation_id=msg.conversation_id,
                        message_id=msg.message_id,
                        attempts=attempt,
                        error=repr(exc),
                    )
                    return
                MESSAGE_WRITE_RETRIES.inc()
                backoff = min(self._max_backoff_s, self._base_backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            else:
                MESSAGES_WRITTEN.inc()
                return

    def _drop(self, msg: StoredMessage, reason: str) -> None:
        MESSAGES_DROPPED.inc()
        log.warning(
            "message_dropped", reason=reason, conversation_id=msg.conversation_id, message_id=msg.message_id
        )
