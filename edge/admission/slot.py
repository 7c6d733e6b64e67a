"""A granted place on one replica, held for the whole generation."""

from __future__ import annotations

from collections.abc import Callable

from edge.admission.replica import Replica
from edge.admission.ticket import Ticket
from edge.upstreams.base import Upstream


class Slot:
    def __init__(
        self,
        replica: Replica,
        ticket: Ticket,
        kv_charge: int,
        granted_at: float,
        on_release: Callable[[Slot, bool], None],
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
        """Give the room back. Idempotent. failed=True: the replica failed this request (before its
        first token) and takes no new work until its health check passes again."""
        if self._released:
            return
        self._released = True
        self._on_release(self, failed)
