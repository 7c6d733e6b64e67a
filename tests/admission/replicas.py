"""A small Upstream whose health, capacity and generation the test controls (a real object, no mocks)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from edge.upstreams.base import Capacity, Delta, GenerationRequest, UpstreamError


class ControlledUpstream:
    def __init__(
        self, name: str, *, kv_tokens_total: int = 10_000, max_sequences: int = 10, kv_block_tokens: int = 1
    ) -> None:
        self.name = name
        self.kv_block_tokens = kv_block_tokens
        # The sequence limit its capacity reports (0: none), as a Triton replica's model config says.
        self.max_sequence_tokens = 0
        self.kv_tokens_total = kv_tokens_total
        self.max_sequences = max_sequences
        self.is_ready = True
        # What back_in_s answers (contract.py's Restarts): a number while down plays a replica that
        # its upstream is restarting, as the local engine process does.
        self.restart_eta_s: float | None = None
        self.fail_generation = False
        self.ready_calls = 0
        self.generated: list[str] = []

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(req)

    async def _generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        if self.fail_generation:
            raise UpstreamError(f"{self.name} is down")
        self.generated.append(req.request_id)
        yield Delta([1])
        yield Delta([2], "stop")

    async def capacity(self) -> Capacity:
        return Capacity(
            self.kv_tokens_total,
            0,
            self.max_sequences,
            0,
            0,
            self.kv_block_tokens,
            max_sequence_tokens=self.max_sequence_tokens,
        )

    async def ready(self) -> bool:
        self.ready_calls += 1
        return self.is_ready

    def back_in_s(self) -> float | None:
        return self.restart_eta_s

    async def aclose(self) -> None:
        return None
