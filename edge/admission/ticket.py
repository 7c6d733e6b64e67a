"""What the edge asks the admission queue for, and how the queue says no."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OverloadReason = Literal["queue_full", "wait_too_long", "no_replica"]


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request waiting for room on a GPU replica."""

    request_id: str
    user: str
    priority: int  # the tier's priority: higher is served first
    kv_tokens: int  # prompt tokens + max_new_tokens: what it may occupy in the KV cache
    max_wait_s: float  # the tier's max_queue_wait_s
    may_use_reserve: bool  # paid tiers may use the reserved share, free may not
    tier: str = ""  # the tier's name, for metrics only; empty means "the priority"
    # The prompt's leading blocks, as prefix_index.routing_hashes names them: where it may hit a cache.
    prefix_keys: tuple[int, ...] = ()
    # Of kv_tokens, the prompt's (None: not known, so real-use accounting charges the worst case).
    prompt_tokens: int | None = None
    # The client's retry of a request it sent before (edge/retry_count.py): demand only where the
    # queue takes it (Dispatcher.precheck).
    retry: bool = False

    @property
    def tier_label(self) -> str:
        return self.tier or str(self.priority)

    @property
    def max_new_tokens(self) -> int | None:
        """The most tokens its reply may run to (None where the prompt's length is not known)."""
        return None if self.prompt_tokens is None else self.kv_tokens - self.prompt_tokens


class Overloaded(Exception):
    """No room in reasonable time: answer 429 with Retry-After = retry_after_s."""

    def __init__(self, reason: OverloadReason, retry_after_s: float) -> None:
        super().__init__(f"overloaded: {reason} (retry after {retry_after_s:.1f}s)")
        self.reason: OverloadReason = reason
        self.retry_after_s = retry_after_s


class NeverFits(Exception):
    """No replica could ever hold the ticket, empty and whatever the wait: the client must ask for
    less (a 400), where a 503 told to come back would be obeyed forever. `kv_limit`: the most KV
    tokens a ticket of its kind may hold on any replica, in whole blocks; `sequences`: whether any
    replica lets its kind run a sequence at all (the paid reserve may take every one); `shared`:
    the limits are this edge's fixed share of each replica, not the whole of it; `prompt_tokens`:
    the prompt's part of kv_tokens (None: not known), what a client must keep under the limit with
    its max_tokens (real-use accounting charges a margin, not max_tokens, for the reply)."""

    def __init__(
        self,
        kv_tokens: int,
        kv_limit: int,
        sequences: bool,
        may_use_reserve: bool,
        shared: bool = False,
        prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(f"never fits: {kv_tokens} KV tokens, at most {kv_limit} (sequences: {sequences})")
        self.kv_tokens = kv_tokens
        self.prompt_tokens = prompt_tokens
        self.kv_limit = kv_limit
        self.sequences = sequences
        self.may_use_reserve = may_use_reserve
        self.shared = shared
