"""A server's real limiter whose leases hold their settle until the test lets them go.

The settle is where a request's end meets the store (its slot freed, and on Redis the answer
whether a cancel sent to another instance came first): holding it makes the races around a
stream's end deterministic, with no sleeps. Swap it in with `holding(server)`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio

from limiter.base import Admission, Limiter, OutputLease, TierLimits
from tests.support.live_server import LiveServer

HOLD_TIMEOUT_S = 30.0


@dataclass
class _HeldLease:
    """The real lease, whose settle first waits for the test's go-ahead."""

    lease: OutputLease
    settling: threading.Event
    release: threading.Event

    def try_take(self, n: int) -> int | None:
        return self.lease.try_take(n)

    async def take(self, n: int) -> int:
        return await self.lease.take(n)

    def give_back(self, n: int) -> None:
        self.lease.give_back(n)

    @property
    def charged(self) -> int:
        return self.lease.charged

    async def settle(self, *, ran: bool = True, cancelled: bool = False) -> bool | None:
        self.settling.set()
        await anyio.to_thread.run_sync(self.release.wait, HOLD_TIMEOUT_S)
        return await self.lease.settle(ran=ran, cancelled=cancelled)


class HoldingLimiter:
    """The server's real limiter, whose leases hold their settle (the request's clean-up)."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.settling = threading.Event()
        self.release = threading.Event()

    async def admit(
        self,
        user: str,
        request_id: str,
        tier: TierLimits,
        input_tokens: int,
        max_output_tokens: int,
        *,
        asked_output_tokens: int | None = None,
    ) -> Admission:
        admission = await self.limiter.admit(
            user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens=asked_output_tokens
        )
        if admission.lease is None:
            return admission
        return Admission(admission.decision, _HeldLease(admission.lease, self.settling, self.release))

    async def aclose(self) -> None:
        await self.limiter.aclose()


@contextmanager
def holding(server: LiveServer) -> Iterator[HoldingLimiter]:
    pipeline = server.app.state.runtime.pipeline
    real = pipeline.limiter
    holder = HoldingLimiter(real)
    pipeline.limiter = holder
    try:
        yield holder
    finally:
        holder.release.set()
        pipeline.limiter = real
