"""Real-use KV accounting: charge a replica for what a request holds, plus a margin, not its worst case.

Worst-case accounting charges prompt + max_tokens for a request's whole life. Replies are usually far
shorter than max_tokens, so most of that charge is KV cache nobody uses while requests queue for it.
Real use charges the prompt plus what has been generated so far plus `margin_tokens` (never more
than the worst case), and grows the charge as tokens stream (Slot.grow), so the edge's count follows
the replica's real occupancy a margin ahead. When replies do run long and a replica's cache fills,
the replica's own preemption is the safety valve: our engine sends the lowest-priority (lowest
tier), newest sequence back to recompute later (TensorRT-LLM's max_utilization scheduler pauses
one), and its stream resumes where it stopped: the client only sees a longer pause.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.admission.ticket import Ticket
from edge.config import AdmissionConfig


@dataclass(frozen=True, slots=True)
class RealUse:
    margin_tokens: int

    def __post_init__(self) -> None:
        if self.margin_tokens < 1:
            raise ValueError("the real-use margin must be at least one token")

    def tokens(self, ticket: Ticket, generated: int = 0) -> int:
        """KV tokens to charge once the request has generated `generated` tokens."""
        if ticket.prompt_tokens is None:
            return ticket.kv_tokens
        return min(ticket.kv_tokens, ticket.prompt_tokens + generated + self.margin_tokens)

    def grows_at(self, ticket: Ticket, charged: int) -> int | None:
        """The generated count at which `charged` stops covering the held tokens plus the margin
        (None: it covers the worst case, so it never grows)."""
        if ticket.prompt_tokens is None or charged >= ticket.kv_tokens:
            return None
        return charged - ticket.prompt_tokens - self.margin_tokens + 1


def real_use(config: AdmissionConfig) -> RealUse | None:
    """The accounting the settings ask for (None: worst case)."""
    return RealUse(config.real_use_margin_tokens) if config.kv_accounting == "real_use" else None
