"""Which replica gets a ticket: the least loaded one that has room for it.

The dispatcher knows every replica's in-flight KV tokens exactly (it assigned them), so it takes the
minimum over all replicas rather than sampling two: power-of-two-choices pays off when load figures
are stale or shared between routers, and here they are neither. Load is measured as the fraction of
the replica's KV cache in use so that replicas of different sizes fill evenly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from edge.admission.replica import Replica
from edge.admission.ticket import Ticket


@dataclass
class Claims:
    """Replicas that a blocked, earlier ticket is waiting on during one dispatch pass.

    A later ticket may not take room there, or small requests would keep overtaking a large one
    (and lower tiers would overtake higher ones). A ticket that may use the reserve waits for any
    room, so it closes the replica to everyone; one that may not waits only for the unreserved
    share, so it closes the replica to other such tickets and leaves the reserve to paid traffic.
    """

    closed_to_all: set[str] = field(default_factory=set)
    closed_to_unreserved: set[str] = field(default_factory=set)

    def is_closed(self, replica: Replica, may_use_reserve: bool) -> bool:
        if replica.name in self.closed_to_all:
            return True
        return not may_use_reserve and replica.name in self.closed_to_unreserved

    def all_closed(self, replicas: Iterable[Replica], may_use_reserve: bool) -> bool:
        """No ticket of this kind can be placed on these replicas any more in this pass."""
        return all(self.is_closed(replica, may_use_reserve) for replica in replicas)

    def claim(self, replicas: Iterable[Replica], may_use_reserve: bool) -> None:
        target = self.closed_to_all if may_use_reserve else self.closed_to_unreserved
        target.update(replica.name for replica in replicas)


def candidates(
    replicas: Iterable[Replica],
    ticket: Ticket,
    kv_tokens: int,
    exclude: frozenset[str],
    reserved_fraction: float,
    *,
    alive_only: bool = False,
) -> list[Replica]:
    """The replicas this ticket could run on once they have room: placeable (or, with alive_only,
    merely passing health checks), not excluded, big enough. Each replica rounds `kv_tokens` up to
    its own KV block size."""
    return [
        r
        for r in replicas
        if (r.alive if alive_only else r.placeable)
        and r.name not in exclude
        and r.could_hold(kv_tokens, ticket.may_use_reserve, reserved_fraction)
    ]


def pick(
    replicas: Iterable[Replica], ticket: Ticket, kv_tokens: int, reserved_fraction: float, claims: Claims
) -> Replica | None:
    best: Replica | None = None
    for replica in replicas:
        if claims.is_closed(replica, ticket.may_use_reserve):
            continue
        if not replica.has_room(kv_tokens, ticket.may_use_reserve, reserved_fraction):
            continue
        if best is None or (replica.utilisation(), replica.sequences) < (best.utilisation(), best.sequences):
            best = replica
    return best
