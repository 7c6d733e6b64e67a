"""When the requests running on the replicas should end, from how far each has got: what a refused
client is told to wait for when long replies hold the places (wait_estimate.py's Retry-After).

The completion rate the wait estimate learns from finished requests says nothing of the ones still
running: after a run of short replies a full queue's Retry-After said 0.9 s while one stream held
the only place for 18 s, and a client that obeyed it was refused 18 times (a review; the SDK gave up
after its retries, 15.8 s in, while the place was busy for 31.8 s).

A running request's reply is expected to run to its user's typical length (reply_lengths.py), or,
once past that, as long again as it has run, never past its max_tokens; its pace is its own since its
first token. One that has not streamed two tokens yet (in its prefill) tells nothing of its own, and
is expected to hold its place a typical service from its grant: left out, its place was not counted
at all, and the places that told something were taken to free for everyone behind (seven of eight
places in their prefill, forty waiting: a Retry-After of 40.8 s where the places free in 5.5 s, a
review). The figure is a bound to wait for, so it is kept within MAX_WAIT_S: a stream stalled
(preempted) after a few tokens reads as a very slow one, and its end as hours away.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from edge.admission.reply_lengths import ReplyLengths
from edge.admission.slot import Slot

# What the official SDK waits at most for a Retry-After; past it, it backs off on its own.
MAX_WAIT_S = 60.0


def expected_ends_s(
    slots: Iterable[Slot], now: float, lengths: ReplyLengths, service_s: float
) -> list[float]:
    """Seconds from now until each running request should end, soonest first, none past MAX_WAIT_S.
    `service_s`: how long a place is typically held, for a request whose pace is not known yet."""
    ends = []
    for slot in slots:
        ticket = slot.ticket
        generated, first, max_new = slot.generated, slot.first_token_at, ticket.max_new_tokens
        if max_new is None or generated < 2 or first is None or now <= first:
            ends.append(min(max(service_s - (now - slot.granted_at), 0.0), MAX_WAIT_S))
            continue
        elapsed = now - first
        typical = lengths.estimate(ticket.user, max_new)
        total = min(max_new, typical if generated < typical else 2 * generated)
        # The first token came at `first`: the pace is over the generated - 1 since.
        ends.append(min(max(total - generated, 0) * elapsed / (generated - 1), MAX_WAIT_S))
    ends.sort()
    return ends


def place_frees_s(ends_s: Sequence[float], places: int, service_s: float) -> list[float]:
    """When each of the next `places` places should free, soonest first: the running requests' ends,
    then each place, taken again by the next in line, one typical service later. Taken as the
    running ends alone, a ticket further back in line than places are running was told the soonest
    end (0.25 s behind a paid ticket told 24.5 s) or the slowest (3,780 s behind a stalled stream)."""
    heap = list(ends_s)
    heapq.heapify(heap)
    frees: list[float] = []
    while heap and len(frees) < places:
        free = heapq.heappop(heap)
        frees.append(free)
        heapq.heappush(heap, free + service_s)
    return frees
