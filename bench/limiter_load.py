"""Concurrent callers through a real limiter, counting what ran: the load of the Redis drills
(tests/faults/test_redis_limiter_drills.py, and their long variants in bench/drills.py).

Each caller admits, holds its slot across a few event-loop turns, charges past its first lease
batch and settles, in a loop. The load counts running requests itself, so over-admission is exact:
more requests running at once than the tier allows, as seen by the only ones running them.
"""

from __future__ import annotations

import asyncio
import uuid

from limiter.base import StoreUnavailable, TierLimits
from limiter.redis_store import RedisLimiter

WAIT_S = 60.0  # only keeps a bug from hanging a drill
_POLL_S = 0.001


class LimiterLoad:
    def __init__(self, limiter: RedisLimiter, limits: TierLimits, workers: int) -> None:
        self.limiter = limiter
        self.limits = limits
        self.workers = workers
        self.user = f"drill-{uuid.uuid4().hex}"
        self.running = 0
        self.most_running = 0
        self.admitted = 0  # what the edge answers 200
        self.refused = 0  # 429
        self.unavailable = 0  # 503 (fail-closed tier, store down)
        self.cut = 0  # streams a fail-closed tier's store stopped mid-way (their 503 error event)
        self.errors: list[BaseException] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def over_admitted(self) -> int:
        return max(0, self.most_running - self.limits.max_concurrent)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(w)) for w in range(self.workers)]

    async def _worker(self, worker: int) -> None:
        step = 0
        while not self._stop.is_set():
            step += 1
            try:
                try:
                    admission = await self.limiter.admit(self.user, f"w{worker}-{step}", self.limits, 5, 64)
                except StoreUnavailable:
                    self.unavailable += 1
                    await asyncio.sleep(0)
                    continue
                if admission.lease is None:
                    self.refused += 1
                    await asyncio.sleep(0)
                    continue
                self.admitted += 1
                self.running += 1
                self.most_running = max(self.most_running, self.running)
                try:
                    for _ in range(3):
                        await asyncio.sleep(0)  # the stream runs: let the other callers in
                    try:
                        await admission.lease.take(40)  # past the first lease batch: one charge
                    except StoreUnavailable:
                        self.cut += 1
                finally:
                    self.running -= 1
                    await admission.lease.settle()
            except Exception as exc:  # nothing may escape the limiter
                self.errors.append(exc)
                return

    async def admitted_more(self, n: int, timeout_s: float = WAIT_S) -> None:
        """Returns once n more requests were admitted; raises if a caller failed or time ran out."""
        target = self.admitted + n
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.admitted < target:
            if self.errors:
                raise AssertionError(f"a caller failed: {self.errors!r}")
            if loop.time() > deadline:
                raise TimeoutError(f"{n} more admissions not reached within {timeout_s:g} s")
            await asyncio.sleep(_POLL_S)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), 30)
        if self.errors:
            raise AssertionError(f"a caller failed: {self.errors!r}")
