"""The day's prompts: a daily curve with bursts that reach the design's peak (30K prompts/s), each
prompt with its tier, its user and its lengths (~1K-token contexts, ~500-token replies).

The simulation runs one GPU group, which serves `1/groups` of the fleet's traffic, and each
simulated request stands for `bundle` identical ones (same user cohort, tier, lengths, arrival):
what one request does to queues, slots and the autoscaler, `bundle` of them do in proportion, and
a day at the design's scale stays a few hundred thousand events.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

DESIGN_PEAK_RPS = 30_000.0  # design walkthrough: ~30K prompts/s at peak
MEAN_CONTEXT_TOKENS = 1000.0  # ~1K-token prompts (history included)
MEAN_OUTPUT_TOKENS = 500.0  # ~500-token replies
DAY_S = 86_400.0


@dataclass(frozen=True)
class Burst:
    start_s: float
    ramp_s: float
    hold_s: float
    peak_fraction: float  # of DESIGN_PEAK_RPS, at the top of the burst


@dataclass(frozen=True)
class DailyCurve:
    """Fraction of the design's peak over the day: a trough at night, a broad afternoon high, and
    bursts (a launch, a news event) on top, up to the peak itself."""

    trough: float = 0.25
    high: float = 0.75
    high_at_s: float = 16 * 3600.0
    bursts: tuple[Burst, ...] = (
        Burst(9 * 3600.0, 600.0, 1200.0, 0.85),  # the working day starts: a fast ramp
        Burst(16 * 3600.0, 300.0, 1800.0, 1.0),  # the design's peak, reached in 5 minutes
        Burst(20 * 3600.0 + 1800.0, 90.0, 600.0, 1.0),  # a news spike: 90 s from the curve to peak
    )

    def fraction(self, t: float) -> float:
        phase = 2 * math.pi * (t - self.high_at_s) / DAY_S
        base = self.trough + (self.high - self.trough) * (1 + math.cos(phase)) / 2
        level = base
        for b in self.bursts:
            if b.start_s <= t < b.start_s + b.ramp_s:
                level = max(level, base + (b.peak_fraction - base) * (t - b.start_s) / b.ramp_s)
            elif b.start_s + b.ramp_s <= t < b.start_s + b.ramp_s + b.hold_s:
                level = max(level, b.peak_fraction)
            elif b.start_s + b.ramp_s + b.hold_s <= t < b.start_s + 2 * b.ramp_s + b.hold_s:
                end = b.start_s + 2 * b.ramp_s + b.hold_s
                level = max(level, base + (b.peak_fraction - base) * (end - t) / b.ramp_s)
        return level


@dataclass(frozen=True)
class Request:
    arrival_s: float
    tier: str
    user: int  # a cohort of `bundle` users acting alike
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class TrafficSpec:
    groups: int = 100  # GPU groups sharing the fleet's traffic; this simulation runs one
    bundle: int = 50  # real requests per simulated request
    paid_share: float = 0.15  # of requests (assumption: paid users are fewer but far more active)
    free_users: int = 1_000_000  # 100M daily users over `groups` groups
    paid_users: int = 50_000
    start_s: float = 0.0
    duration_s: float = DAY_S
    seed: int = 1

    def rate(self, curve: DailyCurve, t: float) -> float:
        """Simulated requests/s at time t."""
        return DESIGN_PEAK_RPS * curve.fraction(t) / self.groups / self.bundle


def lognormal_params(mean: float, sigma: float) -> tuple[float, float]:
    return math.log(mean) - sigma * sigma / 2, sigma


CONTEXT_SIGMA = 0.8
OUTPUT_SIGMA = 0.7


def output_quantile(q: float, cap: int) -> float:
    """Reply length at quantile q (static batching's longest member is a high quantile)."""
    from statistics import NormalDist

    mu, sigma = lognormal_params(MEAN_OUTPUT_TOKENS, OUTPUT_SIGMA)
    return min(float(cap), math.exp(mu + sigma * NormalDist().inv_cdf(min(q, 1 - 1e-12))))


def requests(spec: TrafficSpec, curve: DailyCurve, max_tokens: dict[str, int]) -> Iterator[Request]:
    """Arrivals second by second (Poisson within each second), in time order."""
    rng = np.random.default_rng(spec.seed)
    ctx_mu, ctx_sigma = lognormal_params(MEAN_CONTEXT_TOKENS, CONTEXT_SIGMA)
    out_mu, out_sigma = lognormal_params(MEAN_OUTPUT_TOKENS, OUTPUT_SIGMA)
    cohorts = {"free": max(1, spec.free_users // spec.bundle), "paid": max(1, spec.paid_users // spec.bundle)}
    # How active each cohort is: most users send a few prompts a day, a few send hundreds.
    weights = {}
    for tier, n in cohorts.items():
        w = rng.lognormal(0.0, 1.3, n)
        weights[tier] = np.cumsum(w / w.sum())
    t = spec.start_s
    end = spec.start_s + spec.duration_s
    while t < end:
        n = int(rng.poisson(spec.rate(curve, t)))
        if n:
            times = np.sort(t + rng.random(n))
            paid = rng.random(n) < spec.paid_share
            ctx = np.minimum(16_000, rng.lognormal(ctx_mu, ctx_sigma, n)).astype(int) + 1
            out = rng.lognormal(out_mu, out_sigma, n).astype(int) + 1
            picks = rng.random(n)
            for i in range(n):
                tier = "paid" if paid[i] else "free"
                user = int(np.searchsorted(weights[tier], picks[i]))
                yield Request(float(times[i]), tier, user, int(ctx[i]), int(min(out[i], max_tokens[tier])))
        t += 1.0
