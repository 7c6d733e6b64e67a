"""A model that fails on cue: a stand-in for a step that raises (a numerical fault, a bad batch)."""

from __future__ import annotations

from gpu_container.engine.arrays import Floats
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel

POISON = 66


class FailsOnToken(LlamaModel):
    """The real model, except that a batch holding a prompt that starts with POISON raises."""

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        if POISON in batch.token_ids[batch.positions == 0]:
            raise FloatingPointError("poisoned batch")
        return super().forward(batch, cache)
