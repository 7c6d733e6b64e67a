"""How long a new ticket would wait, and so when a turned-away client should try again.

A new ticket's wait is its place in line (everything in higher tiers plus one request of each user
of its own tier, see TieredQueue.position_of_new) divided by the replicas' completion rate (service_rate.py;
`prior_service_s` before the first completion). A ticket first in line with room for it now waits
nothing, whatever its place counts: past 1 with nothing queued ahead, the place is its user's lead
over the others of its tier (FairQueue.lead_waits), dispatches that users arriving while it waits
would take before it, and a ticket placed at once does not wait for anyone to arrive. Judged by the
place alone, a paid chat client whose reply had just ended beside three others' was refused 429
wait_too_long (13 s at a 10 s service time) while nothing of its tier waited and the replica had
room for it.

Retry-After is that wait, never less than one completion nor MIN_RETRY_S: after a run of short
replies the completion rate reads fast even while long streams hold every place (five 2,000-token
streams holding a replica for 3.6 s gave a full queue's 429 a Retry-After of 20 ms, retried 103
times), and a burst of retries a few ms apart is turned away again while the place that frees goes
to the queue ahead. The wait itself stays as estimated: the precheck's wait_too_long compares it
with the tier's max_wait_s.

With no replica alive but some being restarted by their upstream (the local engine process), the
wait is until the first is back, then the line at their learnt rates, each full of tickets like
this one once back (Replica.completions_per_s_when_back). Counted as no replica at the prior
instead, 28 of 40 requests that arrived while the only engine restarted were refused 429
wait_too_long with Retry-After 65 s; it served again 4 s later with room for 64.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge.admission.replica import Replica
from edge.admission.service_rate import ServiceRate
from edge.admission.ticket import Ticket

MIN_RETRY_S = 0.25


class WaitEstimate:
    def __init__(self, prior_service_s: float, reserved_fraction: float) -> None:
        # No replica alive: assume one at the prior, so the estimate stays finite.
        self._prior = ServiceRate(prior_service_s)
        self._reserve = reserved_fraction

    def wait_s(
        self, position: int, ticket: Ticket, kv_tokens: int, replicas: Sequence[Replica], first: bool
    ) -> float:
        """The wait of a ticket that would be `position`-th in line now, charged `kv_tokens` when
        placed; `first`: nothing is queued ahead of it (TieredQueue.first_in_line)."""
        if first and any(
            r.placeable and r.has_room(kv_tokens, ticket.may_use_reserve, self._reserve) for r in replicas
        ):
            return 0.0
        rate, back_in_s = self._rate(ticket, kv_tokens, replicas)
        return back_in_s + position / rate

    def retry_after_s(
        self,
        position: int,
        ticket: Ticket,
        kv_tokens: int,
        replicas: Sequence[Replica],
        first: bool,
        place_frees_s: Sequence[float] = (),
        frees_age_s: float = 0.0,
    ) -> float:
        """When trying again is worth it: the estimated wait, never less than one completion nor
        MIN_RETRY_S, nor than when the `position`-th place should free (`place_frees_s`, soonest
        first, worked out `frees_age_s` ago: running_ends.py), as far as they tell."""
        wait = self.wait_s(position, ticket, kv_tokens, replicas, first)
        rate, _ = self._rate(ticket, kv_tokens, replicas)
        freed = place_frees_s[position - 1] - frees_age_s if position <= len(place_frees_s) else 0.0
        return max(wait, 1.0 / rate, MIN_RETRY_S, freed)

    def _rate(self, ticket: Ticket, kv_tokens: int, replicas: Sequence[Replica]) -> tuple[float, float]:
        """Completions per second the line moves at, and in how many seconds it starts to: the alive
        replicas', now; with none, the restarting ones', from when the first is back; else one
        replica at the prior, now."""
        alive = sum(r.completions_per_s() for r in replicas if r.alive)
        if alive:
            return alive, 0.0
        coming = [r for r in replicas if r.back_in_s is not None and r.capacity is not None]
        rate = sum(
            r.completions_per_s_when_back(kv_tokens, ticket.may_use_reserve, self._reserve) for r in coming
        )
        if rate:
            return rate, min(r.back_in_s for r in coming if r.back_in_s is not None)
        return self._prior.completions_per_s(1), 0.0
