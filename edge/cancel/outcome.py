"""How a cancel ended: the one answer type of every registry and bus (and of the cancel endpoint)."""

from __future__ import annotations

import enum
from typing import NamedTuple


class CancelOutcome(enum.StrEnum):
    """A str enum: the shared store and its messages carry the same three values as text."""

    CANCELLED = "cancelled"
    NOT_FOUND = "not_found"  # unknown here, or another user's
    FINISHED = "finished"


class CancelAnswer(NamedTuple):
    """A registry's answer to a cancel, and who gave it: this edge (the request is, or was lately,
    its own) or the fleet's store (`by_bus`: the request runs, or ran, on another edge, or this
    edge forgot it). The cancel's log line says which, so an operator reading one edge's lines
    knows whether to look for the stream on another's."""

    outcome: CancelOutcome
    by_bus: bool = False
