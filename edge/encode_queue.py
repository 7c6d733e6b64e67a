"""The worker threads that encode long prompts, handed out by tier: paid prompts first.

A prompt too long to encode on the event loop (edge/prompt_encoding.py) is encoded on a worker
thread before the limiter and the admission queue see its request: until then nothing knows its
token count. It was anyio's default pool, 40 threads in first-come order shared with the key
store's reads. A free tier's flood of long prompts (tens of ms of template and tokenizer each) then
held a paid request's encoding behind all of it, before the tiered queue that keeps paid users
ahead had even seen it, and filled the pool its key lookups wait for as well.

So prompts get threads of their own, one per core (the work is CPU-bound: more threads than cores
only share the cores), and a waiting prompt of a higher-priority tier takes the next free thread
before any of a lower one. Within a tier, a user's prompt takes its turn by how many of its user's
prompts were already waiting or encoding when it came (then first come first served): round robin
between users. First come first served, the encode queue comes before the limiter, so one free
user's 50 concurrent long prompts (48 of them then refused by its concurrency limit) all went ahead
of another free user's one, which waited for the whole flood's encoding before the fair admission
queue had seen its request.

A waiter gives up after its tier's max_queue_wait_s, the bound the admission queue keeps
(edge/admission/dispatcher.py), and is answered as that queue answers a wait too long: 429
`wait_too_long` with Retry-After. Unbounded, a free prompt behind a steady stream of paid long
prompts waited, its client sent no byte, for as long as the paid stream lasted. What it waited here
counts against the same bound in the admission queue (edge/pipeline.py), so the tier's max wait is
the longest its request waits before a replica takes it, not twice that. A waiter that gave up
leaves its entry, done, for a give-back to pass over (`_left_waiting`): its prompt is never
encoded.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from edge.admission.ticket import Overloaded
from edge.admission.wait_estimate import MIN_RETRY_S
from gpu_container.engine.blas_threads import usable_cpus

T = TypeVar("T")

# How much one encoding's time moves the mean a refusal's Retry-After is worked out from.
_WORK_WEIGHT = 0.25


class EncodeQueue:
    """`threads` worker threads, given to waiting callers highest `priority` first."""

    def __init__(self, threads: int) -> None:
        self._size = threads
        self._free = threads
        self._threads = anyio.CapacityLimiter(threads)
        # (-priority, turn, arrival, granted): a heap, the next to be given a thread first.
        self._waiting: list[tuple[int, int, int, asyncio.Future[None]]] = []
        # Each user's prompts waiting or encoding: a new one's turn within its tier.
        self._in_flight: Counter[str] = Counter()
        self._arrivals = itertools.count()
        # Waiters cancelled while their entries stay in the heap (see `_take`).
        self._gone = 0
        # Waiters still waiting, by priority: those ahead of one that gives up, for its Retry-After.
        self._live: Counter[int] = Counter()
        # The mean time one encoding holds a thread (None until one has ended).
        self._work_s: float | None = None

    async def run(
        self, priority: int, max_wait_s: float, work: Callable[..., T], *args: object, user: str = ""
    ) -> tuple[T, float]:
        """`work(*args)` on a thread, and the seconds it waited for one. Raises Overloaded
        ("wait_too_long") where no thread was free for it within `max_wait_s`. `user`: whose
        prompt it is, for its turn among its tier's users."""
        turn = self._in_flight[user]
        self._in_flight[user] += 1
        try:
            return await self._run(priority, turn, max_wait_s, work, *args)
        finally:
            self._in_flight[user] -= 1
            if not self._in_flight[user]:
                del self._in_flight[user]

    async def _run(
        self, priority: int, turn: int, max_wait_s: float, work: Callable[..., T], *args: object
    ) -> tuple[T, float]:
        waited_s = await self._take(priority, turn, max_wait_s)
        # Timed on the thread, from the work's start: a waiter whose client left as it was handed
        # the thread (cancelled at the worker's start, before `work` ran) encoded nothing, and timed
        # from here it recorded about 0 s, pulling the mean its Retry-After is worked out from down.
        worked_s: list[float] = []

        def timed() -> T:
            started = time.perf_counter()
            try:
                return work(*args)
            finally:
                worked_s.append(time.perf_counter() - started)

        try:
            # Once `timed` starts, the wait for it is shielded (anyio's run_sync): it ends with it.
            return await anyio.to_thread.run_sync(timed, limiter=self._threads), waited_s
        finally:
            if worked_s:
                self._worked(worked_s[0])
            self._give_back()

    async def _take(self, priority: int, turn: int, max_wait_s: float) -> float:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return 0.0
        loop = asyncio.get_running_loop()
        joined = loop.time()
        granted = loop.create_future()
        entry = (-priority, turn, next(self._arrivals), granted)
        heapq.heappush(self._waiting, entry)
        self._live[priority] += 1
        try:
            async with asyncio.timeout(max_wait_s):
                await granted
        except TimeoutError:
            if granted.done() and not granted.cancelled():
                return loop.time() - joined  # given a thread as its time ran out: it has it, so it runs
            self._left_waiting(priority)
            raise Overloaded("wait_too_long", self._retry_after_s(priority, max_wait_s)) from None
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._give_back()  # given a thread as it was cancelled: it goes to the next
            else:
                self._left_waiting(priority)
            raise
        return loop.time() - joined

    def _retry_after_s(self, priority: int, waited_s: float) -> float:
        """When a thread should be free for a waiter of `priority` that gives up now: the waiters of
        higher tiers go first, each holding a thread for a mean encoding. Its own tier's earlier
        waiters, with the same bound, have had their turn or left already. With no encoding ended
        yet, every thread has been held at least the `waited_s` it waited: one more such wait. Never
        under the admission queue's MIN_RETRY_S, for the reason it gives (wait_estimate.py)."""
        ahead = sum(count for p, count in self._live.items() if p > priority)
        work_s = waited_s if self._work_s is None else self._work_s
        return max(MIN_RETRY_S, (ahead // self._size + 1) * work_s)

    def _worked(self, seconds: float) -> None:
        self._work_s = (
            seconds if self._work_s is None else self._work_s + _WORK_WEIGHT * (seconds - self._work_s)
        )

    def _left_waiting(self, priority: int) -> None:
        """A waiter's entry stays in the heap, done, for a give-back to pass over: taken out one by
        one (a scan and a re-heap each), a flood's waiters all cancelled at once cost the loop time
        quadratic in their number. Once they are most of the heap, it is rebuilt without them, so
        that cancelled waiters behind a live one do not pile up for as long as it waits."""
        self._live[priority] -= 1
        self._gone += 1
        if self._gone > 64 and 2 * self._gone > len(self._waiting):
            self._waiting = [entry for entry in self._waiting if not entry[3].done()]
            heapq.heapify(self._waiting)
            self._gone = 0

    def _give_back(self) -> None:
        while self._waiting:
            negated, _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():
                self._live[-negated] -= 1
                granted.set_result(None)
                return
            self._gone -= 1
        self._free += 1


_queue: RunVar[EncodeQueue] = RunVar("floodgate_encode_queue")


def encode_queue() -> EncodeQueue:
    """The running event loop's queue (a server's loop in a thread of a test has its own)."""
    try:
        return _queue.get()
    except LookupError:
        queue = EncodeQueue(usable_cpus())
        _queue.set(queue)
        return queue
