"""Gathers engine callbacks per request and lets a test wait for them with a bounded timeout."""

from __future__ import annotations

import threading
from collections import defaultdict

from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.types import EngineConfig, SamplingParams, TokenOutput

TIMEOUT_S = 30.0


class Collector:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.outputs: dict[str, list[TokenOutput]] = defaultdict(list)

    def __call__(self, output: TokenOutput) -> None:
        with self._cond:
            self.outputs[output.request_id].append(output)
            self._cond.notify_all()

    def tokens(self, request_id: str) -> list[int]:
        with self._cond:
            return [t for out in self.outputs[request_id] for t in out.token_ids]

    def finish_reason(self, request_id: str) -> str | None:
        with self._cond:
            outs = self.outputs.get(request_id)
            return outs[-1].finish_reason if outs else None

    def wait_finished(self, *request_ids: str) -> None:
        with self._cond:
            done = self._cond.wait_for(
                lambda: all(self.finish_reason_unlocked(r) is not None for r in request_ids), TIMEOUT_S
            )
        assert done, f"requests did not finish within {TIMEOUT_S}s"

    def wait_tokens(self, request_id: str, count: int) -> None:
        with self._cond:
            done = self._cond.wait_for(
                lambda: sum(len(o.token_ids) for o in self.outputs[request_id]) >= count, TIMEOUT_S
            )
        assert done, f"{request_id} did not produce {count} tokens within {TIMEOUT_S}s"

    def finish_reason_unlocked(self, request_id: str) -> str | None:
        outs = self.outputs.get(request_id)
        return outs[-1].finish_reason if outs else None


def tokens_alone(
    model: LlamaModel, config: EngineConfig, prompt: list[int], params: SamplingParams
) -> list[int]:
    """What `prompt` gets on an engine of its own running nothing else: the reference a test's
    batched, interrupted or preempted run must equal (greedy)."""
    engine, seen = LLMEngine(model, config, eos_token_ids=[1]), Collector()
    engine.start()
    try:
        engine.add_request("alone", prompt, params, seen)
        seen.wait_finished("alone")
        return seen.tokens("alone")
    finally:
        engine.stop()
