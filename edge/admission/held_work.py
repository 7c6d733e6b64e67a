"""When the requests a replica holds now should give their places back: what a refused client waits for.

A request holds its place until its reply ends, so a replica busy with long streams frees nothing for
seconds however short the requests it finished before were. For each place it holds the edge knows,
without asking the replica, the reply's max_tokens and how far it has got: tokens so far and the
time of the first (Slot.grow, called for every relayed delta, keeps both), so its own decode rate,
which already reflects the batch it runs in. What it cannot know is whether the reply stops before
max_tokens; the replica's finished replies teach that (`ReplyPace`): the share of its max_tokens a
reply used, and one stream's tokens per second. A held place is then expected to free after

    (expected length - generated) / the reply's own rate,
    expected length = min(max_tokens, max(share x max_tokens, 2 x generated)):

a reply that has already outrun the typical share is expected to run about as long again, never past
its max_tokens. Before any reply has finished here the share is unknown and a reply is taken to last
the prior service time at its rate. A place whose reply has no token yet (prefill) is expected to
take the expected length at the replica's learnt rate; with no rate learnt either, or a ticket that
does not say its max_tokens, the replica's service time (service_rate.py) less what it has been held.

The places are sorted by when they should free (`FreeTimes`) only when an estimate is asked for (a
request that finds room never asks), and again only once the sort is SNAPSHOT_S old, or RESORT_S
old when a place was taken or given back since: O(places) at most 50 times a second per replica
however fast places turn over (about 1 µs a place), O(log places) an estimate in between, and
nothing on the per-token path beyond Slot.grow's count. (A test on a clock that stands still sees
the first sort until it moves the clock.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edge.admission.slot import Slot

# How long a sorted snapshot serves estimates while no place is taken or given back (the streams'
# progress moves their ends by little in that time), and while some are (a place just given back
# still counts as freeing about now, one just taken is missing: an error of a place or so).
SNAPSHOT_S = 0.1
RESORT_S = 0.02
_ALPHA = 0.2


class _Ewma:
    """An average that forgets: warm start (the first samples averaged plainly), then alpha."""

    __slots__ = ("samples", "value")

    def __init__(self) -> None:
        self.value: float | None = None
        self.samples = 0

    def observe(self, sample: float) -> None:
        self.samples += 1
        if self.value is None:
            self.value = sample
            return
        self.value += max(_ALPHA, 1.0 / self.samples) * (sample - self.value)


class ReplyPace:
    """What one replica's finished replies teach: the share of max_tokens a reply uses, and one
    stream's decode rate (tokens per second)."""

    __slots__ = ("_rate", "_share")

    def __init__(self) -> None:
        self._share = _Ewma()
        self._rate = _Ewma()

    @property
    def share(self) -> float | None:
        return self._share.value

    @property
    def tokens_per_s(self) -> float | None:
        return self._rate.value

    def observe(self, slot: Slot, now: float) -> None:
        """`slot`'s reply ended (ran, not failed) at `now`."""
        max_new = slot.max_new_tokens
        if max_new is not None and max_new > 0:
            self._share.observe(min(1.0, slot.generated / max_new))
        rate = slot.tokens_per_s(now)
        if rate is not None:
            self._rate.observe(rate)


def free_in_s(slot: Slot, now: float, pace: ReplyPace, service_s: float) -> float:
    """The expected seconds until `slot` is given back (the module's rule)."""
    max_new = slot.max_new_tokens
    rate = slot.tokens_per_s(now) or pace.tokens_per_s
    if max_new is None or rate is None:
        return max(service_s - (now - slot.granted_at), 0.0)
    generated = slot.generated
    share = pace.share
    typical = share * max_new if share is not None else rate * service_s
    expected = min(max_new, max(typical, 2 * generated))
    return max(expected - generated, 0) / rate


@dataclass(frozen=True, slots=True)
class FreeTimes:
    """A replica's held places in the order they should free: when (absolute, never before the
    sort), their KV charges and whether a free-tier ticket holds each."""

    taken_at: float
    version: int
    at: list[float]
    charges: list[int]
    free_tier: list[bool]
    sums: list[float]  # sums[i] = at[0] + ... + at[i - 1]
    # How many of them must free before a ticket fits, by (KV charge, may use the reserve): the
    # walk (Replica.frees_before_room) is done once per kind of ticket while the sort serves.
    room_after: dict[tuple[int, bool], int | None] = field(default_factory=dict)

    def fresh(self, now: float, version: int) -> bool:
        age = now - self.taken_at
        return age < SNAPSHOT_S and (version == self.version or age < RESORT_S)


def free_times(
    slots: Iterable[Slot], now: float, pace: ReplyPace, service_s: float, version: int
) -> FreeTimes:
    ends = sorted(
        (
            (now + free_in_s(slot, now, pace, service_s), slot.kv_charge, not slot.ticket.may_use_reserve)
            for slot in slots
        ),
        key=lambda end: end[0],
    )
    at = [end[0] for end in ends]
    return FreeTimes(
        now,
        version,
        at,
        [end[1] for end in ends],
        [end[2] for end in ends],
        [0.0, *accumulate(at)],
    )
