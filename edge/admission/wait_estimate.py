"""How long a new ticket would wait, and so when a turned-away client should try again.

The wait. A new ticket is `position`-th in line (everything in higher tiers plus one DRR round of its
own tier, see TieredQueue.position_of_new): it is placed at the position-th chance of a place that
could hold it. On each replica that could ever hold it, those chances come from the work held there
now (held_work.py: when each held place should free, from its reply's remaining max_tokens, its own
token rate and the length replies here reach): the first once as many held places have freed, in
the order they should, as it takes to make room for this ticket (its KV charge; the reserve, for a
free ticket), then one more with each further place freed; and each freed place serves the queue
again every service time (service_rate.py: what requests finishing here held their place for). The
wait is the time at which the chances, summed over the replicas, reach `position`; nothing for a
ticket first in line with room now, and `position` prior service times with no replica alive.

Retry-After is that wait, and so the time after which the retry should find a place, within
[MIN_RETRY_S, MAX_RETRY_S]:

- at least MIN_RETRY_S: an estimate near nothing (a reply at its max_tokens that has not given its
  place back yet, a snapshot a moment old) would send a burst of retries a few ms apart, each
  turned away again, while the place that does free is taken by the queue ahead (full, or the wait
  too long, or the ticket would not have been refused);
- at most MAX_RETRY_S: the longest the OpenAI SDK has honoured in retry-after-ms (it ignores a
  longer one and retries after its own 0.5-8 s backoff, sooner; its newer versions honour up to
  120 s and give up past that); an estimate that far out is also the least sure, and the retry is
  answered with a fresh one.

Until this rule the wait was position / (occupancy / the mean time finished requests held their
place): after a run of short replies, five 2,000-token streams holding a replica for 3.6 s gave a
full queue's 429 a Retry-After of 20 ms, retried 103 times, and let free requests into a queue
whose 3 s deadline they all then reached. What others do: vLLM and TensorRT-LLM (and Triton in
front of it) queue in the server and tell a client nothing about when to come back (a bounded
waiting queue answering 503 is a vLLM RFC, vllm-project/vllm#18826); OpenAI's rate-limit 429s say
when the limit frees, exactly (retry-after-ms), and its SDK backs off from 0.5 s without one. This
is the same answer for capacity: when the place held now should free.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from edge.admission.held_work import FreeTimes
from edge.admission.replica import Replica
from edge.admission.ticket import Ticket

MIN_RETRY_S = 0.25
MAX_RETRY_S = 60.0
# Past this the wait is "forever" for every purpose (a 429 says MAX_RETRY_S).
_FOREVER_S = 1e6


@dataclass(frozen=True, slots=True)
class _Chances:
    """The chances of a place one replica gives a ticket: from the `first`-th held place to free on
    (and at once too when `opens_now`), then every `cycle_s` from each of those places."""

    frees: FreeTimes
    first: int
    opens_now: bool
    cycle_s: float

    def by(self, when: float, now: float) -> float:
        """How many chances have come by `when` (absolute)."""
        at, sums, first = self.frees.at, self.frees.sums, self.first
        freed = max(bisect_right(at, when, first) - first, 0)
        # Each freed place has served the queue since it freed: the sum of (when - its free time).
        served_s = freed * when - (sums[first + freed] - sums[first])
        chances = freed + served_s / self.cycle_s
        if self.opens_now:
            chances += 1 + (when - now) / self.cycle_s
        return chances


class WaitEstimate:
    def __init__(self, prior_service_s: float, reserved_fraction: float) -> None:
        self._prior_s = prior_service_s
        self._reserve = reserved_fraction
        # The answers found from these sorts (absolute times), by (position, KV charge, may use the
        # reserve): a flood of refusals while the sorts serve costs a look-up each, not a bisection.
        self._sorts: list[FreeTimes] = []
        self._found: dict[tuple[int, int, bool], float] = {}

    def wait_s(
        self, position: int, ticket: Ticket, kv_tokens: int, replicas: Sequence[Replica], now: float
    ) -> float:
        """The wait of a ticket that would be `position`-th in line now, charged `kv_tokens` when
        placed."""
        may_use_reserve = ticket.may_use_reserve
        lanes: list[_Chances] = []
        room_now = False
        for replica in replicas:
            if not replica.alive or not replica.could_hold(kv_tokens, may_use_reserve, self._reserve):
                continue
            frees = replica.free_times(now)
            before = replica.frees_before_room(frees, kv_tokens, may_use_reserve, self._reserve)
            if before is None:  # the count moved since the snapshot: after all of them, then
                before = len(frees.at)
            room_now = room_now or (before == 0 and replica.placeable)
            lanes.append(_Chances(frees, max(before - 1, 0), before == 0, replica.rate.service_s))
        if position == 1 and room_now:
            return 0.0
        if not lanes:
            return position * self._prior_s
        sorts = [lane.frees for lane in lanes]
        if len(sorts) != len(self._sorts) or any(
            a is not b for a, b in zip(sorts, self._sorts, strict=False)
        ):
            self._sorts, self._found = sorts, {}
        key = (position, kv_tokens, may_use_reserve)
        when = self._found.get(key)
        if when is None:
            when = self._found[key] = _when(lanes, position, now)
        return max(when - now, 0.0)

    @staticmethod
    def retry_after_s(wait_s: float) -> float:
        """When trying again is worth it: the estimated wait, within [MIN_RETRY_S, MAX_RETRY_S]."""
        return min(max(wait_s, MIN_RETRY_S), MAX_RETRY_S)


def _when(lanes: list[_Chances], position: int, now: float) -> float:
    """The first time (absolute) by which the lanes have given `position` chances, to 5 ms or 0.2 %:
    a bisection, each step O(replicas x log places)."""

    def enough(when: float) -> bool:
        return sum(lane.by(when, now) for lane in lanes) >= position

    if enough(now):
        return now
    step = 1.0
    while not enough(now + step):
        step *= 2
        if step > _FOREVER_S:
            return now + step
    lo, hi = step / 2 if step > 1.0 else 0.0, step
    while hi - lo > 0.005 + 0.002 * hi:
        mid = (lo + hi) / 2
        if enough(now + mid):
            hi = mid
        else:
            lo = mid
    return now + hi
