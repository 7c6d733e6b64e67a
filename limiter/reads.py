"""The history reads' budget: a user's GET /v1/conversations/{id}/messages, each a store read, in a
GCRA bucket of its own (TierLimits.history_reads_per_window per history_read_window_s), apart from
the chat completions' requests and tokens, so a client paging its history spends none of those.

On Redis it is one atomic step (scripts/read.lua, on the user's Cluster slot); `ReadBuckets` is the
in-process one, and the fallback of the Redis limiter while Redis does not answer (each instance its
share, as the fallback's other limits). A read turned away when Redis is down would turn away a
read of a store that is up for a limit that only guards load, so the fallback never fails closed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from limiter import policy
from limiter.headers import request_headers
from limiter.tiers import TierLimits, share_of

# Every _SWEEP_EVERY reads held, the next SWEEP_SLICE buckets in turn are looked at and those full
# again dropped (a bucket whose TAT has passed holds nothing a fresh one would not): as many looked
# at as reads add, so at most about twice the users of a window are held, and no read looks at more
# than a slice. Sweeping them all at once held the event loop ~90 ms at 400,000 users, every
# stream on the edge with it (MemoryLimiter._sweep slices its users alike).
_SWEEP_EVERY = 1_000
SWEEP_SLICE = 1_000


@dataclass(frozen=True, slots=True)
class ReadDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_ms: int  # until the budget is whole again
    retry_after_ms: int  # 0 when allowed


class ReadLimit(Protocol):
    async def take_read(self, user: str, tier: TierLimits) -> ReadDecision:
        """Spend one history read of the user's budget in `tier`, or say how long until one."""
        ...


def read_rates(tier: TierLimits, instance_count: int = 1) -> tuple[int, int]:
    """(window_us, capacity): with `instance_count` > 1, one instance's share, refilling at its
    share of the rate (as tiers.per_instance does the other budgets)."""
    capacity, window_s = share_of(tier.history_reads_per_window, tier.history_read_window_s, instance_count)
    return round(window_s * policy.MICROS), capacity


def read_headers(decision: ReadDecision) -> dict[str, str]:
    """The request headers OpenAI's rate limits send, for the read budget (it has no tokens)."""
    headers = request_headers(decision.limit, decision.remaining, decision.reset_ms)
    if not decision.allowed:
        headers["retry-after"] = str(max(1, -(-decision.retry_after_ms // 1000)))
        headers["retry-after-ms"] = str(decision.retry_after_ms)
    return headers


class ReadBuckets:
    """Each (user, tier)'s TAT, decided on the event loop (no await between the read and the
    write: atomic as the script is)."""

    def __init__(self) -> None:
        self._tats: dict[tuple[str, str], int] = {}
        self._takes = 0
        self._sweep_keys: list[tuple[str, str]] = []  # looked at next, from the end

    def __len__(self) -> int:
        return len(self._tats)

    def take(self, user: str, tier: TierLimits, now_us: int, instance_count: int = 1) -> ReadDecision:
        window_us, capacity = read_rates(tier, instance_count)
        key = (user, tier.name)
        tat = self._tats.get(key, 0)
        step = policy.gcra(tat, now_us, window_us, capacity, 1)
        if step.wait_us > 0:
            return ReadDecision(
                allowed=False,
                limit=capacity,
                remaining=policy.remaining(tat, now_us, window_us, capacity),
                reset_ms=policy.ceil_ms(policy.reset_us(tat, now_us)),
                retry_after_ms=policy.ceil_ms(step.wait_us),
            )
        self._tats[key] = step.new_tat_us
        self._takes += 1
        if self._takes % _SWEEP_EVERY == 0:
            self._sweep(now_us)
        return ReadDecision(
            allowed=True,
            limit=capacity,
            remaining=policy.remaining(step.new_tat_us, now_us, window_us, capacity),
            reset_ms=policy.ceil_ms(policy.reset_us(step.new_tat_us, now_us)),
            retry_after_ms=0,
        )

    def rescale(self, now_us: int, new: int, old: int) -> None:
        """The instance count went from `old` to `new` (MemoryLimiter.set_instance_count): each
        bucket's lead is its reads times the share's interval, `old` times the tier's, so it is
        scaled to the new interval and keeps the reads spent. Left as it was, a fleet shrunk from 2
        to 1 read a user's 2 of 4 reads as all 4, and refused it for up to a window."""
        for key, tat in self._tats.items():
            if tat > now_us:
                self._tats[key] = now_us + (tat - now_us) * new // old

    def _sweep(self, now_us: int) -> None:
        """Drop the full among the next SWEEP_SLICE buckets (all are looked at in turn, a fresh
        list of names once the last went by)."""
        if not self._sweep_keys:
            self._sweep_keys = list(self._tats)
        keys = self._sweep_keys[-SWEEP_SLICE:]
        del self._sweep_keys[-SWEEP_SLICE:]
        tats = self._tats
        for key in keys:
            tat = tats.get(key)
            if tat is not None and tat <= now_us:
                del tats[key]
