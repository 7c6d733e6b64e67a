"""One GPU replica as the dispatcher sees it: last polled capacity and health, and what it holds now.

The dispatcher is the single point of assignment for this edge, so it counts the KV tokens and
sequences of the tickets it has in flight on each replica itself (exact, no polling lag) and takes
only the totals and the health from the replica's periodic answers.

Several edge instances sending to the same replicas would each count only their own requests; each
then fills only its `share` of each replica (1 / the number of instances, or with [fleet]
members_per_replica 1 / K of the replicas it is among and 0 of the others: edge/membership/), so
together they never overfill one. A replica only this instance reaches (its own local engine)
keeps a share of 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from edge.admission.paid_reserve import fraction_of
from edge.admission.prefix_index import ROUTING_BLOCK_TOKENS, PrefixIndex
from edge.admission.service_rate import ServiceRate
from edge.upstreams.base import Capacity, Upstream


@dataclass(eq=False)
class Replica:
    upstream: Upstream
    rate: ServiceRate
    share: float = 1.0
    # The block size to charge in when the replica reports none (Capacity.kv_block_tokens == 1).
    fallback_block_tokens: int = 1
    capacity: Capacity | None = None
    healthy: bool = False
    # Whether a health check has answered yet: the first one's verdict is logged whatever it is.
    checked: bool = False
    # Set by a failed generation: the replica takes no new work until a health check that started
    # after the failure passes. Holds the number of checks started when it failed.
    suspect_since_check: int | None = None
    # As of the last health check: down, and being brought back by its own upstream (the local
    # engine process starts a new child), expected to serve again in about this many seconds.
    # None: up, or down with no restart known (a Triton host: only its health checks tell).
    back_in_s: float | None = None
    kv_in_use: int = 0
    # The part of kv_in_use charged to tickets that may not use the reserve (free tiers).
    kv_in_use_free: int = 0
    sequences: int = 0
    # The prompt prefixes this edge sent here recently: what the replica's cache probably holds.
    prefix_index: PrefixIndex = field(default_factory=PrefixIndex)
    # The replica's prefix-cache running totals when last looked at: going backwards means it
    # restarted, with an empty cache.
    prefix_totals_seen: int = 0
    # `largest`'s last answer: the capacity it was for, what it was asked, the answer.
    _largest: tuple[Capacity, tuple[bool, float, float], tuple[int, int]] | None = field(
        default=None, repr=False
    )

    @property
    def name(self) -> str:
        return self.upstream.name

    @property
    def alive(self) -> bool:
        """Passed its last health check: requests may keep waiting for it."""
        return self.healthy and self.capacity is not None

    def serves_within(self, wait_s: float) -> bool:
        """Alive, or being restarted and expected back within `wait_s`: a request that may wait
        that long may wait for it. A crash of the local engine is then a short wait for the
        requests that meet it, not a 503 (nor a 502 for one that was on it and cannot have killed
        it: edge/generation.py), as it would be if the replica were down for good."""
        back = self.back_in_s
        # Its size as last polled holds while it restarts (the same engine settings load again).
        return self.alive or (self.capacity is not None and back is not None and back <= wait_s)

    @property
    def size_known(self) -> bool:
        """The replica has said how large it is. A size of no KV cache or no sequence is not one:
        it is what a Triton replica whose TensorRT-LLM gauges are missing or not filled in yet
        reads as (edge/upstreams/triton.py), and no replica could run anything at that size."""
        capacity = self.capacity
        return capacity is not None and capacity.kv_tokens_total > 0 and capacity.max_sequences > 0

    @property
    def placeable(self) -> bool:
        """Alive and not suspect: may be sent new work now."""
        return self.alive and self.suspect_since_check is None

    @property
    def kv_tokens_total(self) -> int:
        """This instance's share of the replica's KV cache."""
        return fraction_of(self.capacity.kv_tokens_total, self.share) if self.capacity else 0

    @property
    def max_sequences(self) -> int:
        return fraction_of(self.capacity.max_sequences, self.share) if self.capacity else 0

    @property
    def block_tokens(self) -> int:
        reported = self.capacity.kv_block_tokens if self.capacity else 1
        return reported if reported > 1 else self.fallback_block_tokens

    def charge(self, kv_tokens: int) -> int:
        """What a request of `kv_tokens` occupies here: whole KV blocks."""
        block = self.block_tokens
        return -(-kv_tokens // block) * block

    def kv_limit(self, may_use_reserve: bool, reserved_fraction: float) -> int:
        total = self.capacity.kv_tokens_total if self.capacity else 0
        return self._limit(total, may_use_reserve, reserved_fraction)

    def sequence_limit(self, may_use_reserve: bool, reserved_fraction: float) -> int:
        total = self.capacity.max_sequences if self.capacity else 0
        return self._limit(total, may_use_reserve, reserved_fraction)

    def _limit(self, total: int, may_use_reserve: bool, reserved_fraction: float) -> int:
        """What a ticket of this kind may hold of `total` here: this instance's share of it, less
        the reserve where it may not use it, rounded down once. Taken off the share already rounded
        down, the reserve rounded a second time: 40 edges' 1.6 sequences each of Triton's 64 became 1,
        and free tiers 0.8 of that, 0 (every free request 503 no_replica on every edge, the
        replicas idle); once, free keeps 1.28 -> 1, and the edges' free parts still add up to no
        more than the unreserved share of the replica."""
        return _part(total, self.share, may_use_reserve, reserved_fraction)

    def could_hold(self, kv_tokens: int, may_use_reserve: bool, reserved_fraction: float) -> bool:
        """Whether the ticket fits on this replica when it is empty."""
        return (
            self.charge(kv_tokens) <= self.kv_limit(may_use_reserve, reserved_fraction)
            and self.sequence_limit(may_use_reserve, reserved_fraction) >= 1
        )

    def largest(self, may_use_reserve: bool, reserved_fraction: float, share: float = 1.0) -> tuple[int, int]:
        """The most KV tokens (whole blocks) and sequences a ticket of this kind could ever hold
        here: its tier's part of `share` of the replica, empty. The whole replica (1) where the
        fleet divides it among the edges there are now: this edge's share grows as edges leave (a
        request past it is only turned away for now, 503); this edge's share where it is fixed
        (Dispatcher's share_fixed). None of it while the size is unknown."""
        capacity = self.capacity
        if capacity is None:
            return 0, 0
        known = self._largest
        asked = may_use_reserve, reserved_fraction, share
        if known is not None and known[0] is capacity and known[1] == asked:
            return known[2]
        block = self.block_tokens
        kv = _part(capacity.kv_tokens_total, share, may_use_reserve, reserved_fraction)
        sequences = _part(capacity.max_sequences, share, may_use_reserve, reserved_fraction)
        found = kv // block * block, sequences
        # Asked for every request (Dispatcher.check_fits); a new one only with each poll's capacity.
        self._largest = capacity, asked, found
        return found

    def add_kv(self, tokens: int, may_use_reserve: bool) -> None:
        """Charge (or, negative, give back) `tokens` for a ticket of this kind."""
        self.kv_in_use += tokens
        if not may_use_reserve:
            self.kv_in_use_free += tokens

    def has_room(self, kv_tokens: int, may_use_reserve: bool, reserved_fraction: float) -> bool:
        in_use = self.kv_in_use
        if may_use_reserve:
            # With real-use accounting free streams grow past their share as they stream, into the
            # reserve. Their overrun does not keep a paid request waiting: the reserve stays paid
            # traffic's, as the policy promises. Our engine makes the room by preempting the lowest
            # priority first (scheduler.py); TensorRT-LLM's max_utilization pauses the newest
            # request, so there the paid one may wait in the replica rather than in this queue.
            in_use -= max(0, self.kv_in_use_free - self.kv_limit(False, reserved_fraction))
        return in_use + self.charge(kv_tokens) <= self.kv_limit(
            may_use_reserve, reserved_fraction
        ) and self.sequences + 1 <= self.sequence_limit(may_use_reserve, reserved_fraction)

    def cached_prefix_tokens(self, prefix_keys: Sequence[int]) -> int:
        """Leading prompt tokens (of a prompt with these routing keys) this replica probably holds."""
        self._forget_if_restarted()
        return self.prefix_index.overlap(prefix_keys) * ROUTING_BLOCK_TOKENS

    def sent_prefix(self, prefix_keys: Sequence[int]) -> None:
        """A prompt with these routing keys was granted here: its prefix will be in this cache."""
        self._forget_if_restarted()
        if self.capacity is not None:
            self.prefix_index.resize(self.kv_tokens_total // ROUTING_BLOCK_TOKENS)
        self.prefix_index.record(prefix_keys)

    def _forget_if_restarted(self) -> None:
        if self.capacity is None:
            return
        totals = self.capacity.prefix_query_tokens + self.capacity.prefix_hit_tokens
        if totals < self.prefix_totals_seen:
            self.prefix_index.clear()
        self.prefix_totals_seen = totals

    def utilisation(self) -> float:
        total = self.kv_tokens_total
        return self.kv_in_use / total if total else 0.0

    def completions_per_s(self) -> float:
        return self.rate.completions_per_s(self.sequences)

    def completions_per_s_when_back(
        self, kv_tokens: int, may_use_reserve: bool, reserved_fraction: float
    ) -> float:
        """A replica being restarted, once back: it comes back empty and takes as many tickets of
        this size as it holds at once, a batch that then completes at its learnt service time (the
        full occupancy an alive replica's rate reads from the queue it is serving)."""
        batch = min(
            self.sequence_limit(may_use_reserve, reserved_fraction),
            self.kv_limit(may_use_reserve, reserved_fraction) // max(self.charge(kv_tokens), 1),
        )
        return self.rate.completions_per_s(batch)


def _part(total: int, share: float, may_use_reserve: bool, reserved_fraction: float) -> int:
    """`share` of `total`, less the reserve for a tier that may not use it, rounded down once."""
    if may_use_reserve:
        return fraction_of(total, share)
    return fraction_of(total, share * (1.0 - reserved_fraction))
