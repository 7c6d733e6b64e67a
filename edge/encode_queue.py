"""The worker threads that encode long prompts, handed out by tier: paid prompts first.

A prompt too long to encode on the event loop (edge/prompt_encoding.py) is encoded on a worker
thread before the limiter and the admission queue see its request: until then nothing knows its
token count. It was anyio's default pool, 40 threads in first-come order shared with the key
store's reads. A free tier's flood of long prompts (tens of ms of template and tokenizer each) then
held a paid request's encoding behind all of it, before the tiered queue that keeps paid users
ahead had even seen it, and filled the pool its key lookups wait for as well.

So prompts get threads of their own, one per core (the work is CPU-bound: more threads than cores
only share the cores), and a waiting prompt of a higher-priority tier takes the next free thread
before any of a lower one; within a tier, first come first served.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from gpu_container.engine.blas_threads import usable_cpus

T = TypeVar("T")


class EncodeQueue:
    """`threads` worker threads, given to waiting callers highest `priority` first."""

    def __init__(self, threads: int) -> None:
        self._free = threads
        self._threads = anyio.CapacityLimiter(threads)
        # (-priority, arrival, granted): a heap, the next to be given a thread first.
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        # Waiters cancelled while their entries stay in the heap (see `_take`).
        self._gone = 0

    async def run(self, priority: int, work: Callable[..., T], *args: object) -> T:
        await self._take(priority)
        try:
            return await anyio.to_thread.run_sync(work, *args, limiter=self._threads)
        finally:
            self._give_back()

    async def _take(self, priority: int) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (-priority, next(self._arrivals), granted)
        heapq.heappush(self._waiting, entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._give_back()  # given a thread as it was cancelled: it goes to the next
            else:
                self._left_waiting()
            raise

    def _left_waiting(self) -> None:
        """A waiter's entry stays in the heap, done, for a give-back to pass over: taken out one by
        one (a scan and a re-heap each), a flood's waiters all cancelled at once cost the loop time
        quadratic in their number. Once they are most of the heap, it is rebuilt without them, so
        that cancelled waiters behind a live one do not pile up for as long as it waits."""
        self._gone += 1
        if self._gone > 64 and 2 * self._gone > len(self._waiting):
            self._waiting = [entry for entry in self._waiting if not entry[2].done()]
            heapq.heapify(self._waiting)
            self._gone = 0

    def _give_back(self) -> None:
        while self._waiting:
            _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():
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
