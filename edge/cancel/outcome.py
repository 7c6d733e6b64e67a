"""How a cancel ended: the one answer type of every registry and bus (and of the cancel endpoint)."""

from __future__ import annotations

import enum


class CancelOutcome(enum.StrEnum):
    """A str enum: the shared store and its messages carry the same three values as text."""

    CANCELLED = "cancelled"
    NOT_FOUND = "not_found"  # unknown here, or another user's
    FINISHED = "finished"
