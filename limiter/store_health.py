"""Whether the shared store is answering: failures open a short backoff, a success closes it.

After a failure the store is left alone for `backoff_s` (so a dead Redis does not cost every
request a timeout), then the next call tries it again: recovery needs no restart. Only a store
that failed to answer counts; a caller that merely waited for a free connection did not reach it
and says nothing about its health (slow is not down).
"""

from __future__ import annotations

import time

import structlog

from limiter.metrics import FALLBACK_ACTIVE, STORE_FAILURES

log = structlog.get_logger("limiter")


class StoreHealth:
    def __init__(self, backoff_s: float) -> None:
        self._backoff_s = backoff_s
        self._down_until = 0.0
        self.failing = False
        # Counts failures: a call that began before one (and may reach a restarted, empty Redis)
        # can tell by comparing this with what it read when it began.
        self.failures = 0

    def retry_in(self) -> float:
        """Seconds until the store may be tried again; 0 when it may be tried now."""
        if not self.failing:
            return 0.0
        return max(0.0, self._down_until - time.monotonic())

    def failed(self, op: str, exc: BaseException) -> None:
        STORE_FAILURES.labels(op=op).inc()
        self.failures += 1
        self._down_until = time.monotonic() + self._backoff_s
        if not self.failing:
            self.failing = True
            FALLBACK_ACTIVE.set(1)
        log.warning(
            "limiter_store_failed",
            op=op,
            error=type(exc).__name__,
            detail=str(exc),
            backoff_s=self._backoff_s,
        )

    def succeeded(self, op: str) -> None:
        if self.failing:
            self.failing = False
            FALLBACK_ACTIVE.set(0)
            log.info("limiter_store_recovered", op=op)
