"""Which replica gets a ticket: the one with room for it where it costs least, load against cache.

The dispatcher knows every replica's in-flight KV tokens exactly (it assigned them), so it takes the
minimum over all replicas rather than sampling two: power-of-two-choices pays off when load figures
are stale or shared between routers, and here they are neither. Load is measured as the fraction of
the replica's KV cache in use so that replicas of different sizes fill evenly.

Prefix-aware (as NVIDIA Dynamo's KV router and llm-d's prefix scorer): a replica that probably holds
the prompt's leading blocks in its cache (prefix_index.py) skips their prefill, so each such token
counts `prefix_weight` tokens off its load: cost = (KV in use - weight x cached prompt tokens) / KV
total. A conversation's next turn goes back to the replica holding its history unless that one is
busier by more than the history is worth; and only replicas with room compete at all, so stickiness
never makes a request wait for one replica while another could take it. Weight 0: least loaded only.
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
    within_s: float | None = None,
) -> list[Replica]:
    """The replicas this ticket could run on once they have room: placeable (or, with `within_s`,
    merely passing health checks, or being restarted and expected back within that many seconds:
    Replica.serves_within), not excluded, big enough. Each replica rounds `kv_tokens` up to its own
    KV block size."""
    return [
        r
        for r in replicas
        if (r.placeable if within_s is None else r.serves_within(within_s))
        and r.name not in exclude
        and r.could_hold(kv_tokens, ticket.may_use_reserve, reserved_fraction)
    ]


def pick(
    replicas: Iterable[Replica],
    ticket: Ticket,
    kv_tokens: int,
    reserved_fraction: float,
    claims: Claims,
    prefix_weight: float = 0.0,
) -> Replica | None:
    best: Replica | None = None
    best_key = (0.0, 0)
    for replica in replicas:
        if claims.is_closed(replica, ticket.may_use_reserve):
            continue
        if not replica.has_room(kv_tokens, ticket.may_use_reserve, reserved_fraction):
            continue
        key = (cost(replica, ticket, prefix_weight), replica.sequences)
        if best is None or key < best_key:
            best, best_key = replica, key
    return best


def cost(replica: Replica, ticket: Ticket, prefix_weight: float) -> float:
    """The replica's load as a fraction of its KV cache, less what its cached prefix saves."""
    total = replica.kv_tokens_total
    if not total:
        return 0.0
    cached = replica.cached_prefix_tokens(ticket.prefix_keys) if prefix_weight else 0
    return (replica.kv_in_use - prefix_weight * cached) / total
