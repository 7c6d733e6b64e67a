"""Whether the shared store is answering: failures open a short backoff, a success closes it.

After a failure the store is left alone for `backoff_s` (so a dead Redis does not cost every
request a timeout), then one call tries it again (the probe) while the others keep to the
fallback: recovery needs no restart, and a Redis that hangs rather than refuses costs one
caller a call's bound per backoff, not every caller that came meanwhile. A probe that ends
neither way (cancelled with its client, or never sent) hands the next call the probe. Only a store
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
        self._probing = False  # a call is trying the failed store
        self.failing = False
        # Counts failures: a call that began before one (and may reach a restarted, empty Redis)
        # can tell by comparing this with what it read when it began.
        self.failures = 0

    def retry_in(self) -> float:
        """Seconds until the store may be tried again; 0 when it may be tried now (while a probe
        is out, a call is then turned away by `may_call` at once: the settle queue, which sleeps
        this long, must not sleep a whole backoff past a probe that succeeds in a millisecond,
        while the slots of requests already ended stay held on the store)."""
        if not self.failing:
            return 0.0
        return max(0.0, self._down_until - time.monotonic())

    def turned_away_for(self, call_s: float) -> float:
        """How long a caller turned away while the store fails should wait before it tries again
        (a fail-closed tier's Retry-After): until the backoff ends; while the probe is out (no
        backoff left), a backoff from now and at least a call's time limit `call_s`, since the
        probe's failure starts another backoff and its success is known within a call. The 1 ms
        this said then had the OpenAI SDK, which prefers retry-after-ms, spend its retries at once
        on the same refusal."""
        left = self.retry_in()
        if left > 0:
            return left
        return max(self._backoff_s, call_s)

    def may_call(self) -> bool:
        """Whether a call may go to the store now: always while it answers; after a failure, once
        the backoff is over, one call at a time (this one, if True: the probe, which must end with
        `failed`, `succeeded` or `probe_ended`)."""
        if not self.failing:
            return True
        if self._probing or time.monotonic() < self._down_until:
            return False
        self._probing = True
        return True

    def probe_ended(self) -> None:
        """The probe is over, whatever became of it: the next call after the backoff may probe."""
        self._probing = False

    def failed(self, op: str, exc: BaseException) -> None:
        STORE_FAILURES.labels(op=op).inc()
        self.failures += 1
        self._down_until = time.monotonic() + self._backoff_s
        self._probing = False
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
        self._probing = False
        if self.failing:
            self.failing = False
            FALLBACK_ACTIVE.set(0)
            log.info("limiter_store_recovered", op=op)
