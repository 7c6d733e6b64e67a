"""One request's state inside the engine: its tokens, where its KV lives, and how far it has got."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpu_container.engine.prefix_hash import ROOT_HASH
from gpu_container.engine.types import SamplingParams, TokenOutput


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    on_output: Callable[[TokenOutput], None]
    priority: int = 0
    # Admission order; a preempted sequence keeps it, so it returns ahead of later arrivals.
    arrival: int = 0
    # Parent of its first block's prefix-cache key: prefix_hash.root_hash of its cache salt, so it
    # shares blocks only with sequences of the same salt.
    prefix_root: int = ROOT_HASH
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache. Reset to 0 on preemption: the sequence is recomputed, but
    # for what the prefix cache still holds of it.
    num_computed_tokens: int = 0
    # Tokens found in the prefix cache at its first admission (so not prefilled then): what the
    # usage reports, as vLLM does. Not a readmission's after a preemption, which finds the
    # sequence's own blocks, computed for this very request.
    num_cached_tokens: int = 0
    admitted: bool = False
    # Prefix-cache keys of its full blocks, first block first (see prefix_hash.py): computed once,
    # kept across preemption, since a sequence's tokens only grow.
    block_hashes: list[int] = field(default_factory=list)
    # Leading blocks of block_table already offered to the prefix cache (BlockManager.seal).
    num_sealed_blocks: int = 0
    rng: np.random.Generator | None = None

    def __post_init__(self) -> None:
        if self.params.temperature > 0:
            self.rng = np.random.default_rng(self.params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Token ids at positions [start, stop) of prompt + output."""
        prompt_len = len(self.prompt_ids)
        if stop <= prompt_len:
            return self.prompt_ids[start:stop]
        if start >= prompt_len:
            return self.output_ids[start - prompt_len : stop - prompt_len]
        return self.prompt_ids[start:] + self.output_ids[: stop - prompt_len]

    def order_key(self) -> tuple[int, int]:
        """Higher priority first, then first come first served."""
        return (-self.priority, self.arrival)
