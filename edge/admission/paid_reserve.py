"""The paid reserve's arithmetic, one home for the replicas' share (replica.py) and the stream
gate's (edge/stream_gate.py): what a tier without the reserve may hold of a total."""

from __future__ import annotations

import math


def fraction_of(total: int, fraction: float) -> int:
    """`fraction` of `total`, rounded down. The epsilon keeps 0.8 * 1000 from flooring to 799
    through float rounding."""
    return math.floor(total * fraction + 1e-9)


def limit_for(total: int, may_use_reserve: bool, reserved_fraction: float) -> int:
    """All of `total` for a tier that may use the reserve; the rest of it without the reserved
    fraction for one that may not (the free tiers)."""
    return total if may_use_reserve else fraction_of(total, 1.0 - reserved_fraction)
