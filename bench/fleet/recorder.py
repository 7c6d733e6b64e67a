"""What the simulation writes down: per-minute series (GPUs, utilisation, demand, 429s) and every
request's TTFT by tier. A simulated request stands for `bundle` real ones, so counts are scaled by
it and percentiles are over simulated requests (each weighs the same)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

REASONS = ("limit", "wait", "no_replica", "drain_cut")


@dataclass
class Minute:
    t: float
    offered: int = 0  # real requests that arrived
    served_tokens: float = 0.0  # real output tokens finished
    gpus_in_service: int = 0
    gpus_billed: int = 0
    warm_hosts: int = 0
    desired_hosts: int = 0
    occupancy: float = 0.0  # running / slots of hosts in service
    full_tokens_per_s: float = 0.0  # what the hosts in service produce with every slot busy
    utilisation: float = 0.0  # their output rate over that, averaged over the period's samples
    demand: float = 0.0  # the scaling metric's period value
    rejected: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


class Recorder:
    def __init__(self, bundle: int) -> None:
        self.bundle = bundle
        self.minutes: dict[int, Minute] = {}
        self.ttft: dict[str, list[float]] = defaultdict(list)
        self.ttft_at: dict[str, list[float]] = defaultdict(list)
        self.tokens = 0.0
        self.offered_by_tier: dict[str, int] = defaultdict(int)
        self.gpu_seconds = 0.0

    def minute(self, now: float) -> Minute:
        key = int(now // 60)
        if key not in self.minutes:
            self.minutes[key] = Minute(key * 60.0)
        return self.minutes[key]

    def offered(self, now: float, tier: str) -> None:
        self.minute(now).offered += self.bundle
        self.offered_by_tier[tier] += self.bundle

    def rejected(self, now: float, tier: str, reason: str) -> None:
        self.minute(now).rejected[(tier, reason)] += self.bundle

    def first_token(self, now: float, tier: str, ttft_s: float) -> None:
        self.ttft[tier].append(ttft_s)
        self.ttft_at[tier].append(now)

    def finished(self, now: float, output_tokens: int) -> None:
        tokens = float(output_tokens * self.bundle)
        self.minute(now).served_tokens += tokens
        self.tokens += tokens

    # -- summaries -----------------------------------------------------------------------------
    def ttft_percentile(self, tier: str, q: float) -> float:
        values = self.ttft.get(tier)
        return float(np.percentile(values, q)) if values else float("nan")

    def rejected_total(self, tier: str, reasons: tuple[str, ...] = REASONS) -> int:
        return sum(m.rejected.get((tier, r), 0) for m in self.minutes.values() for r in reasons)

    def utilisation(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per period: the output rate of the hosts in service over their full-batch output."""
        return self.series("utilisation")

    def series(self, name: str) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        # Periods the autoscaler closed (the last, partial minute of a run has no host figures).
        rows = [
            self.minutes[k]
            for k in sorted(self.minutes)
            if self.minutes[k].full_tokens_per_s or k < max(self.minutes)
        ]
        return np.array([m.t for m in rows]), np.array([float(getattr(m, name)) for m in rows])
