"""Start-time fair queueing between the users of one tier, with service counted in KV tokens.

Each user has a FIFO of waiting requests. A user's head request carries a virtual start tag: where
its user's previous request finished (start + cost), or the tier's virtual time V, whichever is
later. The request with the smallest tag goes next (ties: the one tagged first). So backlogged users
get equal KV-token service whatever their demand: a user sending ten times more requests only pushes
its own tags further ahead; and a user that returns after an idle spell starts at V, with no credit
banked for the time it sent nothing.

V is the service each active user would have had by now, shared equally, as in the fluid model
fair queueing approximates: it is at least the start of every request dispatched, and each request
that ends moves it on by its cost divided by the active users. A user is active while it has a
request waiting or running, and after that while its last finish tag is still ahead of V: in the
fluid model it is still being served then, and a chat client's next request, sent as its reply
ends, finds it so. Kept as plain start-time fair queueing keeps it (the largest start dispatched), V
stood still while first-time users were served, each tagged at V: a returning user, a request's
cost above V, waited behind every newcomer (one place, one new user per completion: a chat client
got 2 of 300 grants). Counting only the users with a request waiting or running, V ran ahead each
time a chat client's reply ended, before its next request arrived, and it lost its place to a busy
user again (a third of the place, as under deficit round robin). Moved on at dispatch rather than
at the end, V took a lone user's long request as done at once, and others arriving while it ran
queued level with that user's next request rather than ahead of it.

Why not deficit round robin, which this replaced: a user's emptied queue left the ring as its last
request was granted, and came back behind every user still in it. With one place and closed loops
(each sends its next request as its last reply ends, as chat clients do), a one-loop user beside a
user with two or eight loops got a third of the place or less (100 and 43 of 300 grants, where
every other one is its share): its next request always arrived behind a turn the other user had
already begun. Tags remember where a user's last request finished, so the returning request is
next in line as soon as the other user has had one of its own.

Why KV tokens and not requests: the KV cache is the resource that caps a batch, so a user sending
4K-token requests should not get eight times the GPU share of one sending 512-token requests. A
request costs its user what `cost` says (the dispatcher's: its prompt and its reply counted at the
user's own average length, edge/admission/reply_lengths.py), not its worst case.

Dispatching happens in passes. A candidate that finds no room is `block`ed: its user sits out the
rest of the pass but keeps its tag, so a user waiting for a large request to fit is first again in
the next pass, instead of being overtaken indefinitely.

When nothing of the tier waits or runs (a busy period's end, in the algorithm's terms), the tags
are forgotten: every request was served and no user is owed anything.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from edge.admission.ticket import Ticket


class Queued(Protocol):
    @property
    def ticket(self) -> Ticket: ...


T = TypeVar("T", bound=Queued)

# Finish tags of users with nothing queued are kept while they can still matter (above V), at most
# about this many; and at most this many users linger.
_FINISH_TAGS_KEPT = 4096


class FairQueue(Generic[T]):
    def __init__(self, cost: Callable[[Ticket], int]) -> None:
        self._cost = cost
        self._queues: dict[str, deque[T]] = {}
        # Users with a queue, by their head's start tag: (tag, order, user). An entry is live while
        # `_entry[user]` is its order; others are left in the heap and skipped.
        self._heap: list[tuple[float, int, str]] = []
        self._entry: dict[str, int] = {}
        self._order = itertools.count()
        self._start: dict[str, float] = {}
        self._finish: dict[str, float] = {}
        self._virtual = 0.0
        # Requests dispatched and not released, per user. Active users: those with a request waiting
        # or running, and the lingering ones, without, whose finish tag is still ahead of V (a
        # heap of (finish, user) to drop them as V passes it).
        self._running: Counter[str] = Counter()
        # What each running request was charged at dispatch, by request id: its end moves V by that,
        # not by a price its user's newer replies have changed since.
        self._charged: dict[str, int] = {}
        self._charged_total = 0  # their sum: what the next ends move V by, for lead_waits
        # Each waiting user's next request, priced when it came to the head of its user's queue,
        # and their sum: what the next ends cost while nothing of the tier runs (`_cost_per_end`),
        # without pricing every waiting user for each request that asks.
        self._head_cost: dict[str, int] = {}
        self._head_total = 0
        self._lingering: dict[str, float] = {}
        self._linger_heap: list[tuple[float, str]] = []
        self._active = 0
        self._blocked: list[tuple[float, int, str]] = []
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
        """Items queued counting at most per_user from each user: what a fair share of that many
        requests per user serves. Cheap: users are counted by queue length."""
        return sum(users * min(length, per_user) for length, users in self._users_by_length.items())

    def lead_waits(self, ticket: Ticket) -> int:
        """How many dispatches a new request of this user waits for because its user is ahead of
        V (0: not): V must first reach its user's finish tag, moving on by a request's cost over
        the active users at each end, so every other active user, waiting now or arriving
        meanwhile (each tagged at V), goes first for that long (the wait estimate's part). Only
        while it waits: a request first in line with room now is placed at once, its lead aside
        (WaitEstimate.wait_s). The active users, not only those waiting now: the users who may
        return set V's pace, and newcomers do arrive meanwhile; counted from the waiting users
        alone, a chat client beside one newcomer per completion waited 1.58 times its estimate
        (median), against 1.06.

        Counted in what the requests running now cost on average (`_cost_per_end`): their ends
        are what move V. Counted in the request's own cost, a 21-token ping
        after its user's 1,020-token request, beside users queueing requests alike, was told 68
        dispatches (32 per other user) where two went before it."""
        finish = self._finish.get(ticket.user)
        if finish is None or finish <= self._virtual:
            return 0
        units = (finish - self._virtual) / max(self._cost_per_end(ticket), 1)
        return math.ceil(units * max(self._active - 1, 0))

    def _cost_per_end(self, ticket: Ticket) -> float:
        """What the ends that move V next cost, on average: the running requests' charges; with
        none running (a higher tier holds every place), the next request of each waiting user,
        which run before it; with none waiting either, the request's own cost. Counted in its own
        cost whenever nothing of its tier ran, a 21-token ping after its user's 1,020-token request
        was told 65 dispatches where three went before it."""
        running = len(self._charged)
        if running:
            return self._charged_total / running
        if self._head_cost:
            return self._head_total / len(self._head_cost)
        return self._cost(ticket)

    def push(self, item: T) -> None:
        user = item.ticket.user
        queue = self._queues.get(user)
        if queue is None:
            queue = self._queues[user] = deque()
            if not self._running[user]:
                self._gains_work(user)
            self._tag(user, max(self._virtual, self._finish.get(user, 0.0)))
            self._new_head(user, item)
        queue.append(item)
        self._counted(item, len(queue) - 1, +1)

    def remove(self, item: T) -> bool:
        """Take a waiting item out (its request was cancelled or timed out); False if not queued.
        The user's tag stays: the next request in its queue starts where the removed one would have."""
        user = item.ticket.user
        queue = self._queues.get(user)
        if queue is None:
            return False
        was_head = bool(queue) and queue[0] is item
        try:
            queue.remove(item)
        except ValueError:
            return False
        self._counted(item, len(queue) + 1, -1)
        if not queue:
            self._drop_user(user)
        elif was_head:
            self._new_head(user, queue[0])
        return True

    def repriced(self, user: str) -> None:
        """The user's price may have changed (one of its replies ended: the dispatcher's cost counts
        its replies at their average): its next request, waiting at the head of its queue, is
        priced again. Kept at the price it had when it came to the head, it counted in
        `_cost_per_end` (a returning user's lead, the Retry-After told) at a price long gone."""
        queue = self._queues.get(user)
        if queue:
            self._new_head(user, queue[0])

    def begin_pass(self) -> None:
        for entry in self._blocked:
            if self._live(entry):
                heapq.heappush(self._heap, entry)
        self._blocked.clear()

    def next_candidate(self) -> T | None:
        """The item served next among users not blocked in this pass, or None."""
        heap = self._heap
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        return self._queues[heap[0][2]][0] if heap else None

    def commit(self, item: T) -> None:
        """The candidate from next_candidate() was dispatched."""
        user = item.ticket.user
        queue = self._queues[user]
        if not queue or queue[0] is not item or not self._heap or self._heap[0][2] != user:
            raise ValueError("commit() takes the candidate next_candidate() returned")
        heapq.heappop(self._heap)
        queue.popleft()
        self._counted(item, len(queue) + 1, -1)
        self._running[user] += 1  # active already: it was waiting
        finish = self._served(item.ticket, self._start[user])
        if queue:
            self._tag(user, finish)
            self._new_head(user, queue[0])
        else:
            self._drop_user(user)

    def placed_at_once(self, ticket: Ticket) -> None:
        """A request of this tier was dispatched without queueing (nobody waited): it runs, and
        counts against its user, all the same."""
        user = ticket.user
        self._running[user] += 1
        if self._running[user] == 1 and user not in self._queues:
            self._gains_work(user)
        self._served(ticket, max(self._virtual, self._finish.get(user, 0.0)))

    def released(self, ticket: Ticket, *, served: bool = True) -> None:
        """A request this queue dispatched (commit or placed_at_once) has ended: the active users'
        share of it is service V counts as done. `served=False`: nothing ran for its user (its
        replica failed it before its first token, or it was withdrawn as it was granted), who is not
        charged for it (`_refund`)."""
        charged = self._charged.pop(ticket.request_id, None)
        if charged is None:
            return  # not dispatched here, or told twice
        self._charged_total -= charged
        user = ticket.user
        if served:
            self._advance(self._virtual + charged / max(self._active, 1))
        else:
            self._refund(user, charged)
        self._running[user] -= 1
        if self._running[user] > 0:
            return
        del self._running[user]
        if user not in self._queues:
            self._loses_work(user)

    def _refund(self, user: str, charged: int) -> None:
        """Take back what a request its replica failed was charged: its user's finish tag, and its
        next request's start tag (set from that finish or a later one), move back by it, never
        below V (no credit banked). Charged, a request that failed over before its first token
        went again behind one request of every other user of its tier, as if it had been served
        (with 4 users waiting, 4 dispatches before its retry, which a wait bound turned away)."""
        finish = self._finish.get(user)
        if finish is not None:
            self._finish[user] = max(self._virtual, finish - charged)
        queue = self._queues.get(user)
        if queue:
            start = max(self._virtual, self._start[user] - charged)
            if start < self._start[user]:
                self._tag(user, start)

    def block(self, item: T) -> None:
        """The candidate found no room: its user waits, with its tag, until the next pass."""
        if not self._heap or self._heap[0][2] != item.ticket.user:
            raise ValueError("block() takes the candidate next_candidate() returned")
        self._blocked.append(heapq.heappop(self._heap))

    def _served(self, ticket: Ticket, start: float) -> float:
        """Dispatch bookkeeping: the user's finish tag; V is at least the start of what runs."""
        cost = self._charged[ticket.request_id] = self._cost(ticket)
        self._charged_total += cost
        finish = self._finish[ticket.user] = start + cost
        if start > self._virtual:
            self._advance(start)
        return finish

    def _advance(self, virtual: float) -> None:
        self._virtual = virtual
        heap = self._linger_heap
        while heap and heap[0][0] <= virtual:
            tag, gone = heapq.heappop(heap)
            if self._lingering.get(gone) == tag:
                del self._lingering[gone]
                self._active -= 1

    def _gains_work(self, user: str) -> None:
        if self._lingering.pop(user, None) is None:
            self._active += 1

    def _loses_work(self, user: str) -> None:
        finish = self._finish.get(user)
        if not self._queues and not self._running:
            # Nothing waits or runs: every request was served, nobody is owed anything, nor owes.
            # (Lingering users too: a long request that ended beside another user's left its own
            # user lingering far ahead of V, and its next request, after any idle spell, behind
            # a hundred of the other's.)
            self._heap.clear()
            self._blocked.clear()
            self._finish.clear()
            self._lingering.clear()
            self._linger_heap.clear()
            self._active = 0
            return
        if finish is not None and finish > self._virtual:
            self._lingering[user] = finish
            heapq.heappush(self._linger_heap, (finish, user))
            # Past the bound, those nearest to V stop lingering early: they would soonest anyway.
            while len(self._lingering) > _FINISH_TAGS_KEPT:
                tag, gone = heapq.heappop(self._linger_heap)
                if self._lingering.get(gone) == tag:
                    del self._lingering[gone]
                    self._active -= 1
            if len(self._linger_heap) > 2 * len(self._lingering) + 64:
                self._linger_heap = [(f, u) for u, f in self._lingering.items()]
                heapq.heapify(self._linger_heap)
        else:
            self._active -= 1
        if len(self._finish) > _FINISH_TAGS_KEPT:
            self._forget_finishes()

    def _tag(self, user: str, start: float) -> None:
        order = next(self._order)
        self._start[user] = start
        self._entry[user] = order
        heapq.heappush(self._heap, (start, order, user))

    def _live(self, entry: tuple[float, int, str]) -> bool:
        return self._entry.get(entry[2]) == entry[1]

    def _counted(self, item: T, length_before: int, change: int) -> None:
        self._size += change
        self.reserve_items += change if item.ticket.may_use_reserve else 0
        if length_before:
            self._users_by_length[length_before] -= 1
            if not self._users_by_length[length_before]:
                del self._users_by_length[length_before]
        if length_before + change:
            self._users_by_length[length_before + change] += 1

    def _new_head(self, user: str, item: T) -> None:
        """`item` is next in its user's queue now: its price counts in `_head_total`."""
        cost = self._cost(item.ticket)
        self._head_total += cost - self._head_cost.get(user, 0)
        self._head_cost[user] = cost

    def _drop_user(self, user: str) -> None:
        # Its heap entry (or blocked one) is dead from here; its finish tag stays while it matters.
        del self._queues[user]
        del self._entry[user]
        self._head_total -= self._head_cost.pop(user)
        del self._start[user]
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._heap = [entry for entry in self._heap if self._live(entry)]
            heapq.heapify(self._heap)
        if not self._running[user]:
            del self._running[user]
            self._loses_work(user)

    def _forget_finishes(self) -> None:
        """Drop the finish tags V has overtaken; past the bound still, those nearest V, whose users
        (were they to come back) would start at V instead, a request's cost early at most."""
        virtual = self._virtual
        kept = {u: f for u, f in self._finish.items() if f > virtual or u in self._queues}
        if len(kept) > _FINISH_TAGS_KEPT // 2:
            kept = dict(sorted(kept.items(), key=lambda uf: uf[1])[-(_FINISH_TAGS_KEPT // 2) :])
        self._finish = kept
