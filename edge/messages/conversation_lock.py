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
Nor may a store that answers late: the lock is the one store call on a request's way to its first
token and at its end, and a connection gone silent (a DynamoDB host lost mid-failover: botocore
waits its 5 s read timeout, then retries) or a SQLite file another writer holds (its 5 s busy
wait) held every conversation request that long before its first token, and every stream's end
as long before its `[DONE]`. So the take waits TAKE_WAIT_S, the release RELEASE_WAIT_S, and then
the request goes on without: a take that lands later is given back at once by its own thread, a
release that lands later lands. The calls run on threads of their own (LOCK_THREADS), not the
process's shared pool: blocked on a silent store they took every thread the key lookups and the
usage writes wait for; with none free because the store has left every one of them unanswered past
TAKE_WAIT_S, a request goes on unlocked at once. Threads busy with calls the store is answering (a
burst of conversation requests, more at once than LOCK_THREADS) are waited for within the take's
TAKE_WAIT_S: skipped at once, a burst of 40 on a store answering in milliseconds ran 32 of them
unlocked, and a conversation's three requests all ran.

The lock also keeps the order of the turns. A history reads back in message-id order, and ids are
made from the clock of the edge that serves each turn: an edge whose clock ran a few milliseconds
behind the one that served the last turn (NTP keeps a fleet's clocks that close, not closer) made
its question an id below the reply it followed, and the history read question, question, reply,
reply. So a release leaves the conversation's newest message id in the lock (`last_message_id`)
and the next take, on whatever edge, reads it back in the same write that takes the lock (no read
of its own); that request's turns are made greater (edge/messages/ids.py), as a hybrid logical
clock orders events across machines. Released, the lock is kept ORDER_KEPT_S longer for this
(not deleted), with no holder: any request may take it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.to_thread
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
# How long a request waits for its lock to be taken, and its end for the lock to be given back,
# before going on without (a store answers in milliseconds: DynamoDB's p99 is tens of them).
TAKE_WAIT_S = 0.5
RELEASE_WAIT_S = 0.5
# Threads the locks' store calls may hold at once (the store's own to_thread calls share anyio's
# default pool of 40 with the key lookups and the usage writer).
LOCK_THREADS = 8
# How long a released lock is kept, to give the next request its conversation's newest message id:
# longer than any skew between the fleet's clocks (milliseconds under NTP), short enough that an
# edge of the release before, which takes a lock only once it has expired, waits no longer for it.
ORDER_KEPT_S = 1.0


class ConversationLocked(Exception):
    """Another request holds the conversation."""


@dataclass(frozen=True, slots=True)
class Taken:
    """A lock taken, and what its last holder left in it."""

    last_message_id: str | None  # the conversation's newest message id; None where none was left


class LockStore(Protocol):
    """The lock's three steps, each one atomic in the store, blocking (ConversationLocks runs them
    on threads of its own). Times are Unix seconds (time.time)."""

    def take_lock(
        self, user: str, conversation_id: str, holder: str, now: float, expires_at: float
    ) -> Taken | None:
        """Hold the conversation for `holder` until `expires_at`, unless another holds it past `now`
        (None then)."""
        ...

    def renew_lock(self, user: str, conversation_id: str, holder: str, expires_at: float) -> bool:
        """Move the holder's lock's end to `expires_at`; False where `holder` no longer holds it."""
        ...

    def release_lock(
        self, user: str, conversation_id: str, holder: str, kept_until: float, last_message_id: str | None
    ) -> None:
        """Give the lock back, if `holder` still holds it: no holder, kept until `kept_until` with
        `last_message_id` (where not None) for the next take."""
        ...


class _Take:
    """A take on its thread and the request that waits for it: which of the two gives up first."""

    __slots__ = ("abandoned", "guard", "taken")

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.abandoned = False  # the request went on without the lock
        self.taken = False  # the lock landed, and the request was told


class HeldLock:
    """One request's hold on its conversation, given back once (`release`)."""

    __slots__ = ("_locks", "_released", "conversation_id", "expires_at", "holder", "last_message_id", "user")

    def __init__(
        self,
        locks: ConversationLocks,
        user: str,
        conversation_id: str,
        holder: str,
        expires_at: float,
        last_message_id: str | None,
    ) -> None:
        self._locks = locks
        self.user = user
        self.conversation_id = conversation_id
        self.holder = holder
        # When the store lets another request take it, as last written.
        self.expires_at = expires_at
        # The conversation's newest message id: as the take read it, then each turn this request
        # made (its turns are made greater); left in the lock by the release, for the next request.
        self.last_message_id = last_message_id
        self._released = False

    async def release(self) -> None:
        """Give the lock back (idempotent): ConversationLocks.give_back."""
        if self._released:
            return
        self._released = True
        self._locks.forget(self)
        await self._locks.give_back(self.user, self.conversation_id, self.holder, self.last_message_id)


class ConversationLocks:
    def __init__(
        self,
        store: LockStore,
        *,
        ttl_s: float = LOCK_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._ttl_s = ttl_s
        self._clock = clock
        self._threads = anyio.CapacityLimiter(LOCK_THREADS)
        self._held: set[HeldLock] = set()
        # When each store call now on a lock thread began (time.monotonic), by call.
        self._calls_started: dict[object, float] = {}
        self._calls_guard = threading.Lock()
        self._renewer: asyncio.Task[None] | None = None

    async def _in_thread(self, call: Callable[..., object], *args: object) -> object:
        """`call(*args)` on one of the locks' threads; a cancel abandons it there (it runs on)."""
        return await anyio.to_thread.run_sync(
            self._timed, call, *args, limiter=self._threads, abandon_on_cancel=True
        )

    def _timed(self, call: Callable[..., object], *args: object) -> object:
        """`call(*args)`, its start noted while it runs (`_store_silent`)."""
        token = object()
        with self._calls_guard:
            self._calls_started[token] = time.monotonic()
        try:
            return call(*args)
        finally:
            with self._calls_guard:
                del self._calls_started[token]

    def _store_silent(self) -> bool:
        """Every lock thread holds a store call unanswered past TAKE_WAIT_S."""
        now = time.monotonic()
        with self._calls_guard:
            started = list(self._calls_started.values())
        return len(started) >= LOCK_THREADS and all(now - start >= TAKE_WAIT_S for start in started)

    async def give_back(
        self, user: str, conversation_id: str, holder: str, last_message_id: str | None = None
    ) -> None:
        """The store's release of `holder`'s lock. Shielded: it runs as a cancelled request ends (its
        client left), and a release cut short would block the conversation until the lock expired.
        Waited for RELEASE_WAIT_S at most: past it the call goes on on its thread and lands when the
        store answers, and the request's end does not wait for it. A store that fails here is
        logged; the lock then expires on its own."""
        with cancel_scope(shield=True), anyio.move_on_after(RELEASE_WAIT_S):
            try:
                kept_until = self._clock() + ORDER_KEPT_S
                await self._in_thread(
                    self.store.release_lock, user, conversation_id, holder, kept_until, last_message_id
                )
            except Exception as exc:
                log.warning(
                    "conversation_lock_release_failed",
                    conversation_id=conversation_id,
                    request_id=holder,
                    error=repr(exc),
                )

    async def take(self, user: str, conversation_id: str, holder: str) -> HeldLock | None:
        """The conversation held for request `holder`; raises ConversationLocked where another
        request holds it. None: the store could not be asked, and the request goes on unlocked."""
        if self._threads.available_tokens < 1 and self._store_silent():
            _skipped(conversation_id, holder, "every lock thread waits on the store")
            return None
        now = self._clock()
        expires_at = now + self._ttl_s
        attempt = _Take()

        def take() -> Taken | None:
            taken = self.store.take_lock(user, conversation_id, holder, now, expires_at)
            with attempt.guard:
                if not attempt.abandoned:
                    attempt.taken = taken is not None
                    return taken
            if taken is not None:  # its request went on without it: nobody else would give it back
                last = taken.last_message_id  # no turn made: the conversation's newest is unchanged
                self.store.release_lock(user, conversation_id, holder, self._clock() + ORDER_KEPT_S, last)
            return None

        try:
            with anyio.fail_after(TAKE_WAIT_S):
                taken = await self._in_thread(take)
        except TimeoutError:
            with attempt.guard:
                attempt.abandoned = True
                landed = attempt.taken  # between the thread's answer and the timeout
            if landed:
                await self.give_back(user, conversation_id, holder)
            _skipped(conversation_id, holder, f"no answer within {TAKE_WAIT_S:g} s")
            return None
        except Exception as exc:
            _skipped(conversation_id, holder, repr(exc))
            return None
        if not isinstance(taken, Taken):
            raise ConversationLocked(conversation_id)
        held = HeldLock(self, user, conversation_id, holder, expires_at, taken.last_message_id)
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
            *(
                self._in_thread(self.store.renew_lock, h.user, h.conversation_id, h.holder, expires_at)
                for h in held
            ),
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
            await asyncio.sleep(RENEW_EVERY_S)
            try:
                await self.renew()
            except Exception as exc:  # the next step tries again; the loop must not end
                log.warning("conversation_lock_renewal_failed", error=repr(exc))


def _skipped(conversation_id: str, holder: str, why: str) -> None:
    """The request goes on without its conversation's lock (counted, logged)."""
    CONVERSATION_LOCKS_SKIPPED.inc()
    log.warning(
        "conversation_lock_unavailable", conversation_id=conversation_id, request_id=holder, error=why
    )
