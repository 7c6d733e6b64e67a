"""Strict priority between tiers, fair queueing between the users of a tier."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic

from edge.admission.fair_queue import FairQueue, T
from edge.admission.ticket import Ticket


class TieredQueue(Generic[T]):
    def __init__(self, cost: Callable[[Ticket], int]) -> None:
        """`cost`: what a ticket costs its user in the fair queue (fair_queue.py)."""
        self._cost = cost
        self._tiers: dict[int, FairQueue[T]] = {}

    def __len__(self) -> int:
        return sum(len(tier) for tier in self._tiers.values())

    def __iter__(self) -> Iterator[T]:
        for tier in self._tiers.values():
            yield from tier

    def push(self, item: T) -> None:
        self._tier(item.ticket.priority).push(item)

    def _tier(self, priority: int) -> FairQueue[T]:
        tier = self._tiers.get(priority)
        if tier is None:
            tier = self._tiers[priority] = FairQueue(self._cost)
        return tier

    def placed_at_once(self, ticket: Ticket) -> None:
        """A ticket was dispatched with nobody queued (FairQueue.placed_at_once)."""
        self._tier(ticket.priority).placed_at_once(ticket)

    def released(self, ticket: Ticket, *, served: bool = True) -> None:
        """A dispatched ticket's request ended (FairQueue.released)."""
        self._tier(ticket.priority).released(ticket, served=served)

    def repriced(self, user: str) -> None:
        """The user's price may have changed (FairQueue.repriced), in whichever tier it waits: its
        keys may be of several."""
        for tier in self._tiers.values():
            tier.repriced(user)

    def remove(self, item: T) -> bool:
        tier = self._tiers.get(item.ticket.priority)
        return tier is not None and tier.remove(item)

    def tiers(self) -> list[FairQueue[T]]:
        """The non-empty tiers, highest priority first."""
        return [self._tiers[p] for p in sorted(self._tiers, reverse=True) if len(self._tiers[p])]

    def depth_from(self, priority: int) -> int:
        """The tickets queued at `priority` or above: those a new ticket of it would not pass."""
        return sum(len(tier) for p, tier in self._tiers.items() if p >= priority)

    def under_fair_share(self, ticket: Ticket, max_queue: int) -> bool:
        """Whether the ticket's user holds fewer of its tier's waiting places than an equal share of
        `max_queue` among the tier's waiting users, itself counted: such a ticket joins a queue its
        own tier filled. Without it, one user's loops kept the tier's queue full and every other
        user of the tier was turned away (queue_full) while that user was served (a review: a heavy
        user's 43 replies to five light users' 4, and their 96 refusals). Never past twice
        `max_queue` (each newcomer's share, added up, would reach several times it); higher tiers
        filling it alone still close it."""
        tier = self._tiers.get(ticket.priority)
        if tier is None or self.depth_from(ticket.priority + 1) >= max_queue:
            return False
        if self.depth_from(ticket.priority) >= 2 * max_queue:
            return False
        mine = tier.queued_by(ticket.user)
        return mine < max_queue // (tier.users_waiting() + (0 if mine else 1))

    def depth_of(self, priority: int, label: str) -> int:
        """The tickets queued by the tier named `label` (Ticket.tier_label): tiers may share a
        priority, and so a queue. Counted, as only a metrics scrape asks."""
        tier = self._tiers.get(priority)
        return 0 if tier is None else sum(1 for item in tier if item.ticket.tier_label == label)

    def first_in_line(self, ticket: Ticket) -> bool:
        """Whether a new ticket would be next in line: nothing queued at its priority or above (its
        user's own earlier requests included). Such a ticket with room now is placed at once."""
        return not self.depth_from(ticket.priority)

    def position_of_new(self, ticket: Ticket) -> int:
        """How many dispatches a new ticket would wait for, itself included, if it waits at all.

        Everything queued in higher tiers goes first. Within its tier, fair queueing serves every
        other user about as many times as this user (requests of similar size assumed): a light
        user behind a flood waits for one request of each other user, not for the whole flood; and
        a user just served waits besides for the others to catch up (FairQueue.lead_waits), users
        arriving while it waits included. Those arrive only while it waits: a ticket first in line
        (first_in_line) with room now waits for none of them, whatever this counts
        (WaitEstimate.wait_s).
        """
        ahead = sum(len(tier) for p, tier in self._tiers.items() if p > ticket.priority)
        tier = self._tiers.get(ticket.priority)
        if tier is None:
            return ahead + 1
        return ahead + tier.backlog_within(tier.queued_by(ticket.user) + 1) + tier.lead_waits(ticket) + 1
