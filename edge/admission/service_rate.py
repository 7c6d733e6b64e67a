"""How fast a replica completes requests when it is full, learnt from the requests it completes.

Completions per second are derived by Little's law, throughput = requests in flight / time each
spends in service, from an EWMA of the service time and the replica's current occupancy. Counting
completions per second directly would read near zero on a quiet replica and so overstate the wait
at the first burst; the wait estimate is only needed when a replica is full, which is exactly when
its occupancy is the batch it can sustain.
"""

from __future__ import annotations


class ServiceRate:
    def __init__(self, prior_service_s: float, alpha: float = 0.2) -> None:
        if prior_service_s <= 0 or not 0 < alpha <= 1:
            raise ValueError("prior_service_s must be positive and alpha in (0, 1]")
        self._service_s = prior_service_s  # the prior holds until the first completion
        self._alpha = alpha
        self.samples = 0

    @property
    def service_s(self) -> float:
        return self._service_s

    def observe(self, service_s: float) -> None:
        """One request completed after service_s seconds on the replica."""
        if service_s <= 0:
            return
        self.samples += 1
        # Warm start: the first samples are averaged plainly (the first replaces the prior), so a
        # wrong prior is forgotten within a few completions instead of decaying by (1 - alpha)^n.
        alpha = max(self._alpha, 1.0 / self.samples)
        self._service_s += alpha * (service_s - self._service_s)

    def completions_per_s(self, in_flight: int) -> float:
        return max(in_flight, 1) / self._service_s
