"""One request at a time per conversation (a user's `conversation_id`), across every edge that
shares the message store.

Two requests of one user on one conversation at once (a double-clicked Send, two tabs) stored
their turns interleaved: question 1, question 2, reply 1, reply 2, a history that reads wrong and,
sent back, feeds the model a wrong one. OpenAI's Responses API refuses the second request of a
conversation already in use (400 `conversation_locked`, Pipeline.admit answers the same); so does
the edge: the lock is taken once the request is known to be good and whose it is, before the
limiter charges it, and given back when the request ends, however it ends (Generation.close).

The lock is a row (SQLite) or an item (DynamoDB) of the message store, which `serve --workers N`
and a fleet share; it names its holder (the request id), and only the holder gives it back. An
edge that dies holding one leaves it to expire: LOCK_TTL_S after the last renewal.

Why renewed rather than sized from a bound on a request's duration: the settings hold none. A
reply may run to its tier's max_tokens at whatever speed a loaded replica generates it (a 32k
token reply at 10 tokens/s is nearly an hour), a slow reader is cut only after one send waits
`[server] stalled_reader_s`, and `[engine] stall_timeout_s` bounds a replica's silence, not its
work. A lock sized for the longest request would block a dead edge's conversations for that long.
So a held lock is renewed while its request runs (one task per edge for all of them, as the
limiter's concurrency slots are kept alive by their leases), once less than half of LOCK_TTL_S is
left of it, and expires LOCK_TTL_S after an edge stops renewing it. Renewed only when due, not every
tick: each renewal is a write to the store (a DynamoDB write unit), and renewing every held lock
every 5 s made a reply of 20 s cost four writes besides its take and release, at the design's
150-300K open streams tens of thousands of writes a second; now a request shorter than half the
expiry (most replies) costs the take and the release alone, a longer one a renewal per 15 s.

A store that cannot be asked (down, or SQLite busy past its wait) admits the request unlocked
(counted, logged): a conversation's history is kept off the hot path, best effort (the writer
drops turns rather than slow a stream), and an outage of the store must not become one of chat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from edge.cancel.scope import cancel_scope
from edge.messages.metrics import CONVERSATION_LOCKS_LOST, CONVERSATION_LOCKS_SKIPPED
from edge.task_stop import stop_task

log = structlog.get_logger(__name__)

# How long a lock outlives its last renewal: how long a dead edge blocks its conversations.
LOCK_TTL_S = 30.0
# How often the renewal task looks for locks with less than half of LOCK_TTL_S left: two tries at
# least before one expires.
RENEW_EVERY_S = 5.0


class ConversationLocked(Exception):
    """Another request holds the conversation."""


class LockStore(Protocol):
    """The lock's three steps, each one atomic in the store. Times are Unix seconds (time.time)."""

    async def take_lock(
        self, user: str, conversation_id: str, holder: str, now: float, expires_at: float
    ) -> bool:
        """Hold the conversation for `holder` until `expires_at`, unless another holds it past `now`."""
        ...

    async def renew_lock(self, user: str, conversation_id: str, holder: str, expires_at: float) -> bool:
        """Move the holder's lock's end to `expires_at`; False where `holder` no longer holds it."""
        ...

    async def release_lock(self, user: str, conversation_id: str, holder: str) -> None:
        """Give the lock back, if `holder` still holds it."""
        ...


class HeldLock:
    """One request's hold on its conversation, given back once (`release`)."""

    __slots__ = ("_locks", "_released", "conversation_id", "expires_at", "holder", "user")

    def __init__(
        self, locks: ConversationLocks, user: str, conversation_id: str, holder: str, expires_at: float
    ) -> None:
        self._locks = locks
        self.user = user
        self.conversation_id = conversation_id
        self.holder = holder
        # When the store lets another request take it, as last written.
        self.expires_at = expires_at
        self._released = False

    async def release(self) -> None:
        """Give the lock back (idempotent). Shielded: it runs as a cancelled request ends (its client
        left), and a release cut short would block the conversation until the lock expired. A store
        that fails here is logged; the lock then expires on its own."""
        if self._released:
            return
        self._released = True
        self._locks.forget(self)
        with cancel_scope(shield=True):
            try:
                await self._locks.store.release_lock(self.user, self.conversation_id, self.holder)
            except Exception as exc:
                log.warning(
                    "conversation_lock_release_failed",
                    conversation_id=self.conversation_id,
                    request_id=self.holder,
                    error=repr(exc),
                )


class ConversationLocks:
    def __init__(
        self,
        store: LockStore,
        *,
        ttl_s: float = LOCK_TTL_S,
        renew_every_s: float = RENEW_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._ttl_s = ttl_s
        self._renew_every_s = renew_every_s
        self._clock = clock
        self._held: set[HeldLock] = set()
        self._renewer: asyncio.Task[None] | None = None

    async def take(self, user: str, conversation_id: str, holder: str) -> HeldLock | None:
        """The conversation held for request `holder`; raises ConversationLocked where another
        request holds it. None: the store could not be asked, and the request goes on unlocked."""
        now = self._clock()
        expires_at = now + self._ttl_s
        try:
            taken = await self.store.take_lock(user, conversation_id, holder, now, expires_at)
        except Exception as exc:
            CONVERSATION_LOCKS_SKIPPED.inc()
            log.warning(
                "conversation_lock_unavailable",
                conversation_id=conversation_id,
                request_id=holder,
                error=repr(exc),
            )
            return None
        if not taken:
            raise ConversationLocked(conversation_id)
        held = HeldLock(self, user, conversation_id, holder, expires_at)
        self._held.add(held)
        return held

    def forget(self, held: HeldLock) -> None:
        """No longer renewed (released)."""
        self._held.discard(held)

    async def renew(self) -> None:
        """Move the end of every held lock with less than half of LOCK_TTL_S left to LOCK_TTL_S past
        now (the renewal task's step)."""
        now = self._clock()
        due_before = now + self._ttl_s / 2
        held = [h for h in self._held if h.expires_at < due_before]
        if not held:
            return
        expires_at = now + self._ttl_s
        answers = await asyncio.gather(
            *(self.store.renew_lock(h.user, h.conversation_id, h.holder, expires_at) for h in held),
            return_exceptions=True,
        )
        for lock, answer in zip(held, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("conversation_lock_renew_failed", request_id=lock.holder, error=repr(answer))
            elif answer:
                lock.expires_at = expires_at
            elif lock in self._held:  # not released meanwhile, and no longer this request's
                # Expired (renewals failed for LOCK_TTL_S) and maybe taken by another request: its
                # turns may interleave with this one's. Nothing is left to renew.
                self._held.discard(lock)
                CONVERSATION_LOCKS_LOST.inc()
                log.warning(
                    "conversation_lock_lost", conversation_id=lock.conversation_id, request_id=lock.holder
                )

    def start(self) -> None:
        if self._renewer is None:
            loop = asyncio.get_running_loop()
            self._renewer = loop.create_task(self._renew_loop(), name="conversation-locks")

    async def aclose(self) -> None:
        if self._renewer is not None:
            await stop_task(self._renewer)
            self._renewer = None

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every_s)
            try:
                await self.renew()
            except Exception as exc:  # the next step tries again; the loop must not end
                log.warning("conversation_lock_renewal_failed", error=repr(exc))
