"""A replica's KV-cache figures as people read them: prefix-cache hits, blocks by state, preemptions.

Computed from the `Capacity` the dispatcher's health poll last read (never from a call to the
replica), so whoever shows them, /metrics or the playground's stats line, answers at once even when
a replica hangs. Blocks: `used` are held by sequences, `cached` are free but keep a reusable prefix
(taken back when a prompt shares it, evicted least recently used first), `free` hold nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.upstreams.base import Capacity


@dataclass(frozen=True, slots=True)
class CacheFigures:
    prefix_hit_tokens: int
    prefix_query_tokens: int
    blocks_used: int
    blocks_cached: int
    blocks_free: int
    preemptions: int

    @classmethod
    def of(cls, cap: Capacity) -> CacheFigures:
        block = max(cap.kv_block_tokens, 1)
        used = cap.kv_tokens_used // block
        cached = cap.kv_tokens_cached // block
        return cls(
            prefix_hit_tokens=cap.prefix_hit_tokens,
            prefix_query_tokens=cap.prefix_query_tokens,
            blocks_used=used,
            blocks_cached=cached,
            blocks_free=cap.kv_tokens_total // block - used - cached,
            preemptions=cap.preemptions,
        )

    @property
    def prefix_hit_rate(self) -> float | None:
        """Hit tokens over looked-up tokens; None where the replica does not say what it looked up
        (TensorRT-LLM reports reused blocks only): no rate rather than a wrong one."""
        if not self.prefix_query_tokens:
            return None
        return self.prefix_hit_tokens / self.prefix_query_tokens
