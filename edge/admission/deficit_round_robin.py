"""Deficit round robin between the users of one tier, with the quantum in KV tokens.

Each user has a FIFO of waiting requests and a deficit counter. The user at the front of the ring
starts a turn by adding `quantum` KV tokens to its deficit (only when its head does not already fit
in it, so a user that was blocked keeps, but does not grow, what it had), then is served while its
head fits in the deficit; then the turn passes to the next user. Backlogged users therefore get equal
KV-token service whatever their demand: a user sending ten times more requests only lengthens its
own queue.

Why KV tokens and not requests: the KV cache is the resource that caps a batch, so a user sending
4K-token requests should not get eight times the GPU share of one sending 512-token requests. A small
quantum (a typical request or less) keeps the interleaving fine-grained.

A request costs its user what `cost` says (the dispatcher's: its prompt and its reply counted at
the user's own average length, edge/admission/reply_lengths.py), not its worst case.

A turn serves at most the requests its user had waiting when it began. A user's closed loops (each
sends its next request as its last reply ends) came back within a turn that lasted several short
requests and kept it going, while another user's waited for it: two alike users got 30 and 118
replies on a real edge. The deficit left when a turn ends so carries to the user's next turn.

Dispatching happens in passes. A candidate that finds no room is `block`ed: its user sits out the rest
of the pass but keeps its place and its deficit, so a user waiting for a large request to fit is
served first when room appears, instead of being overtaken indefinitely.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from edge.admission.ticket import Ticket


class Queued(Protocol):
    @property
    def ticket(self) -> Ticket: ...


T = TypeVar("T", bound=Queued)


class DeficitRoundRobin(Generic[T]):
    def __init__(self, quantum: int, cost: Callable[[Ticket], int]) -> None:
        if quantum < 1:
            raise ValueError("the quantum must be at least one KV token")
        self._quantum = quantum
        self._cost = cost
        self._queues: dict[str, deque[T]] = {}
        self._deficit: dict[str, int] = {}
        self._ring: deque[str] = deque()
        # The users in a turn, and how many more of the requests they had waiting when it began the
        # turn may serve. A turn gets one quantum however many passes it spans (blocked, a user
        # keeps its place).
        self._turn_left: dict[str, int] = {}
        self._blocked: set[str] = set()
        self._size = 0
        self._users_by_length: Counter[int] = Counter()
        self.reserve_items = 0  # queued items that may use the paid reserve

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        for queue in self._queues.values():
            yield from queue

    def queued_by(self, user: str) -> int:
        queue = self._queues.get(user)
        return len(queue) if queue else 0

    def users_waiting(self) -> int:
        return len(self._queues)

    def backlog_within(self, per_user: int) -> int:
        """Items queued counting at most per_user from each user: what one DRR round of that many
        requests per user serves. Cheap: users are counted by queue length."""
        return sum(users * min(length, per_user) for length, users in self._users_by_length.items())

    def push(self, item: T) -> None:
        user = item.ticket.user
        queue = self._queues.get(user)
        if queue is None:
            queue = self._queues[user] = deque()
            self._deficit[user] = 0
            self._ring.append(user)
        queue.append(item)
        self._counted(item, len(queue) - 1, +1)

    def remove(self, item: T) -> bool:
        """Take a waiting item out (its request was cancelled or timed out); False if not queued."""
        user = item.ticket.user
        queue = self._queues.get(user)
        if queue is None:
            return False
        try:
            queue.remove(item)
        except ValueError:
            return False
        self._counted(item, len(queue) + 1, -1)
        if not queue:
            self._drop_user(user)
        return True

    def begin_pass(self) -> None:
        self._blocked.clear()

    def next_candidate(self) -> T | None:
        """The item DRR serves next among users not blocked in this pass, or None."""
        while True:
            user = self._first_unblocked()
            if user is None:
                return None
            queue = self._queues[user]
            head = queue[0]
            cost = self._cost(head.ticket)
            if user not in self._turn_left:
                self._turn_left[user] = len(queue)
                if self._deficit[user] < cost:
                    self._deficit[user] += self._quantum
            if self._turn_left[user] and self._deficit[user] >= cost:
                return head
            self._end_turn(user)

    def commit(self, item: T) -> None:
        """The candidate from next_candidate() was dispatched."""
        user = item.ticket.user
        queue = self._queues[user]
        if not queue or queue[0] is not item:
            raise ValueError("commit() takes the candidate next_candidate() returned")
        queue.popleft()
        self._counted(item, len(queue) + 1, -1)
        self._deficit[user] -= self._cost(item.ticket)
        if user in self._turn_left:
            self._turn_left[user] -= 1
        if not queue:
            self._drop_user(user)

    def block(self, item: T) -> None:
        """The candidate found no room: its user waits, in place, until the next pass."""
        user = item.ticket.user
        self._blocked.add(user)

    def _first_unblocked(self) -> str | None:
        # Only the first unblocked user is ever blocked and turns only move unblocked users to the
        # back, so within a pass the blocked users are exactly the front of the ring.
        skip = len(self._blocked)
        return self._ring[skip] if skip < len(self._ring) else None

    def _counted(self, item: T, length_before: int, change: int) -> None:
        self._size += change
        self.reserve_items += change if item.ticket.may_use_reserve else 0
        if length_before:
            self._users_by_length[length_before] -= 1
            if not self._users_by_length[length_before]:
                del self._users_by_length[length_before]
        if length_before + change:
            self._users_by_length[length_before + change] += 1

    def _end_turn(self, user: str) -> None:
        self._ring.remove(user)
        self._ring.append(user)
        self._turn_left.pop(user, None)

    def _drop_user(self, user: str) -> None:
        # An emptied queue forfeits its deficit, as in DRR: credit is not banked while idle.
        del self._queues[user]
        del self._deficit[user]
        self._ring.remove(user)
        self._blocked.discard(user)
        self._turn_left.pop(user, None)
