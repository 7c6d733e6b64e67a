"""How long a replica's requests hold their place, learnt from the requests it completes.

An EWMA of the time from placement to release (the prior until the first completion). The wait
estimate (wait_estimate.py) takes it as how often a place, once freed, serves the queue again: the
work beyond what the replica holds now, whose own end held_work.py estimates stream by stream.
Until then the estimate divided occupancy by it (Little's law) and so judged long streams by the
short requests finished before them.
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
