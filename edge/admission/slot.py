"""A granted place on one replica, held for the whole generation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from edge.admission.replica import Replica
from edge.admission.ticket import Ticket
from edge.upstreams.base import Upstream

# "done": the generation ran (its duration teaches the service rate); "failed": the replica failed it;
# "unused": granted to a request that had already gone away.
ReleaseKind = Literal["done", "failed", "unused"]


class Slot:
    def __init__(
        self,
        replica: Replica,
        ticket: Ticket,
        kv_charge: int,
        granted_at: float,
        on_release: Callable[[Slot, ReleaseKind], None],
    ) -> None:
        self.upstream: Upstream = replica.upstream
        self.replica = replica
        self.ticket = ticket
        self.kv_charge = kv_charge
        self.granted_at = granted_at
        self._on_release = on_release
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self, *, failed: bool = False) -> None:
        """Give the room back. Idempotent; call it on the event loop's thread. failed=True: the
        replica failed this request (before its first token) and takes no new work until its health
        check passes again."""
        self._give_back("failed" if failed else "done")

    def discard(self) -> None:
        """Give back a slot that was never used (its request was cancelled as it was granted)."""
        self._give_back("unused")

    def _give_back(self, kind: ReleaseKind) -> None:
        if self._released:
            return
        self._released = True
        self._on_release(self, kind)
