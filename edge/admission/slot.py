"""A granted place on one replica, held for the whole generation.

Its KV charge is either the worst case (prompt + max_tokens) for its whole life, or, with real-use
accounting (real_use.py), what the request holds so far plus a margin, growing as tokens stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from edge.admission.real_use import RealUse
from edge.admission.replica import Replica
from edge.admission.ticket import Ticket
from edge.upstreams.base import Upstream

# "finished": the reply ran to its own end (a stop, its max_tokens): its duration teaches the service
# rate, its tokens the user's usual reply. "cut": it streamed and was stopped before its end (a
# cancel, a disconnect, the drain's deadline, its key's end, the token budget, a stalled reader):
# its place freed then, so its duration is a service time like any other departure, but its tokens
# only say the reply would have run at least that long (learnt as its length, a cancel 5 tokens in
# took a user's usual 40 down to 22, a review). "failed": the replica failed it. "unused": given
# back before its first token, nothing ran to learn from (counted as done, these taught the user's
# usual reply as 0 tokens, a review). "withdrawn": granted to a request that had already gone away
# (cancelled in the turn it was granted), never sent to the replica: like a cancel while queued it
# costs its user nothing (counted as served, its user's next request waited a turn behind every
# other backlogged user of its tier).
ReleaseKind = Literal["finished", "cut", "failed", "unused", "withdrawn"]


class Slot:
    def __init__(
        self,
        replica: Replica,
        ticket: Ticket,
        kv_charge: int,
        granted_at: float,
        on_release: Callable[[Slot, ReleaseKind], None],
        clock: Callable[[], float],
        real_use: RealUse | None = None,
    ) -> None:
        self.upstream: Upstream = replica.upstream
        self.replica = replica
        self.ticket = ticket
        self.kv_charge = kv_charge
        self.granted_at = granted_at
        self._on_release = on_release
        self._released = False
        self._real_use = real_use
        # Tokens generated so far, as last told (grow): when it ends, what its user's replies are
        # learnt to run (reply_lengths.py), the fair queue's price of the user's next requests.
        self.generated = 0
        # When its first token came (the dispatcher's clock): its pace is counted from there, not
        # from the grant, which a long prompt's prefill would make look slow (running_ends.py).
        self.first_token_at: float | None = None
        # Set by `mark_finished`: the reply ran to its own end. Without it, one given back after its
        # first token was cut: only a positive word makes its length the reply's.
        self._finished = False
        self._clock = clock
        # Generated tokens from which the charge no longer covers held tokens + margin.
        self._grow_at = real_use.grows_at(ticket, kv_charge) if real_use else None

    @property
    def released(self) -> bool:
        return self._released

    def grow(self, generated: int) -> None:
        """The request has generated this many tokens: with real-use accounting, charge the replica
        for them (plus the margin, whole blocks) once they pass what was charged. Cheap when they
        have not: it runs for every streamed delta."""
        self.generated = generated
        if self.first_token_at is None:
            self.first_token_at = self._clock()
        if self._grow_at is None or generated < self._grow_at or self._released:
            return
        assert self._real_use is not None
        charge = self.replica.charge(self._real_use.tokens(self.ticket, generated))
        if charge > self.kv_charge:
            self.replica.add_kv(charge - self.kv_charge, self.ticket.may_use_reserve)
            self.kv_charge = charge
        self._grow_at = self._real_use.grows_at(self.ticket, self.kv_charge)

    def mark_finished(self) -> None:
        """The reply ran to its own end (its last `grow` is its length): released, it teaches the
        user's usual reply. Not for one the edge or its client stopped."""
        self._finished = True

    def release(self, *, failed: bool = False) -> None:
        """Give the room back. Idempotent; call it on the event loop's thread. failed=True: the
        replica failed this request and takes no new work until its health check passes again.
        Otherwise "unused" before a first token (`grow`); after one, "finished" where
        `mark_finished` was called, else "cut"."""
        if failed:
            kind: ReleaseKind = "failed"
        elif self.first_token_at is None:
            kind = "unused"
        else:
            kind = "finished" if self._finished else "cut"
        self._give_back(kind)

    def discard(self) -> None:
        """Give back a slot that was never used (its request was cancelled as it was granted)."""
        self._give_back("withdrawn")

    def _give_back(self, kind: ReleaseKind) -> None:
        if self._released:
            return
        self._released = True
        self._on_release(self, kind)
