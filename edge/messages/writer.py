"""Message persistence off the hot path: a bounded queue drained by one background task.

A conversation's history read on this edge waits for the turns of that conversation this edge has
queued and not yet written (`written`): a client that reloads the history when its reply ends
(its stream's [DONE], its JSON answer) finds the reply there, as OpenAI's conversation items are
once a response completes. The reply is queued before the client sees the end (Generation.close
runs first), so the wait covers it; another edge's queue it cannot see (README.md, "Conversation
history").
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import random

import structlog

from edge.messages.message import StoredMessage
from edge.messages.metrics import (
    HISTORY_READS_UNWRITTEN,
    HISTORY_READS_WAITING,
    MESSAGE_WRITE_RETRIES,
    MESSAGES_DROPPED,
    MESSAGES_FAILED,
    MESSAGES_WRITTEN,
)
from edge.messages.store import MessageRefused, MessageStore
from edge.task_stop import stop_task

log = structlog.get_logger(__name__)

# The most text (characters of content) the queue holds, whatever its count ([messages]
# queue_size): a message may be as long as a request body (1 MiB), and while the store lagged or
# was down the edge kept up to queue_size of them, gigabytes, until it was killed for its memory
# with every stream it served. Past it, a message is dropped as one past queue_size is.
QUEUE_CHARS = 100_000_000


class MessageWriter:
    """`submit` never waits: a request stream must not slow down because the store is slow, so a full
    queue (`queue_size` messages, or QUEUE_CHARS of their text) drops the message (counted and
    logged) instead. The worker retries a failed write with jittered exponential backoff before
    giving up on that message."""

    def __init__(
        self,
        store: MessageStore,
        queue_size: int,
        *,
        queue_chars: int = QUEUE_CHARS,
        max_attempts: int = 5,
        base_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        drain_timeout_s: float = 1.0,
    ) -> None:
        # drain_timeout_s: the exit's margin before SIGKILL is 5 s (docs/deploy.md, Graceful drain),
        # shared with the cut streams' last writes and the usage rows written after these.
        self._store = store
        # Each message with its place in the queue's order: one worker takes them in that order, so
        # "every message up to n is done" is one number, `_done`.
        self._queue: asyncio.Queue[tuple[int, StoredMessage]] = asyncio.Queue(maxsize=queue_size)
        self._queued = 0
        self._done = 0
        # The text of the messages queued and not yet done with (the one being written included).
        self._queue_chars = queue_chars
        self._chars = 0
        # (conversation_id, user) → the place of its latest message queued and not yet done: a
        # read of that history waits until `_done` reaches it. Messages queued after the read began
        # do not hold it up (a conversation written to without pause still gets its answer).
        self._latest: dict[tuple[str, str], int] = {}
        # Reads waiting, by the place they wait for (a heap: the worker wakes the front ones).
        self._readers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._reader_ids = itertools.count()
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
        place = self._queued + 1
        chars = self._chars + len(msg.content)
        if chars > self._queue_chars and self._chars:  # alone, however long, it is taken
            self._drop(msg, "queue_full")
            return False
        try:
            self._queue.put_nowait((place, msg))
        except asyncio.QueueFull:
            self._drop(msg, "queue_full")
            return False
        self._queued = place
        self._chars = chars
        self._latest[(msg.conversation_id, msg.user)] = place
        return True

    async def written(self, conversation_id: str, user: str, timeout_s: float) -> bool:
        """Wait, at most `timeout_s`, until every message of this conversation and user queued so
        far is written (or given up on, or dropped by the shutdown). False: the wait ran out first,
        and a read now may miss them."""
        place = self._latest.get((conversation_id, user))
        if place is None or place <= self._done:
            return True
        if timeout_s <= 0:  # [messages] read_wait_s = 0: reads never wait
            HISTORY_READS_UNWRITTEN.inc()
            return False
        reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._readers, (place, next(self._reader_ids), reader))
        HISTORY_READS_WAITING.inc()
        try:
            await asyncio.wait({reader}, timeout=timeout_s)
        finally:
            HISTORY_READS_WAITING.dec()
            if not reader.done():
                reader.cancel()  # left in the heap: the worker skips it
        if reader.cancelled():
            HISTORY_READS_UNWRITTEN.inc()
            log.info("history_read_before_written", conversation_id=conversation_id, waited_s=timeout_s)
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
        # Nothing more will be written: a read waiting reads what is there.
        self._finished(self._queued)
        if left:
            MESSAGES_DROPPED.inc(left)
            log.warning("message_writer_drain_incomplete", dropped=left)

    async def _run(self) -> None:
        while True:
            place, self._writing = await self._queue.get()
            try:
                await self._write(self._writing)
            finally:
                key = (self._writing.conversation_id, self._writing.user)
                if self._latest.get(key) == place:
                    del self._latest[key]
                self._chars -= len(self._writing.content)
                self._writing = None
                self._finished(place)
                self._queue.task_done()

    def _finished(self, place: int) -> None:
        """Every message up to `place` is done with: wake the reads that waited for no later one."""
        self._done = max(self._done, place)
        readers = self._readers
        while readers and readers[0][0] <= self._done:
            reader = heapq.heappop(readers)[2]
            if not reader.done():
                reader.set_result(None)

    async def _write(self, msg: StoredMessage) -> None:
        for attempt in range(1, self._max_attempts + 1):
            try:
                await self._store.append(msg)
            except Exception as exc:
                # A refused message is given up at once: retried, it would fail the same way while
                # every message queued behind it waited.
                if attempt == self._max_attempts or isinstance(exc, MessageRefused):
                    MESSAGES_FAILED.inc()
                    # Written by the writer's own task, outside the request's bound context:
                    # its request named here, as every line a request causes names it.
                    log.error(
                        "message_write_failed",
                        request_id=msg.request_id,
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
            "message_dropped",
            request_id=msg.request_id,
            reason=reason,
            conversation_id=msg.conversation_id,
            message_id=msg.message_id,
        )
