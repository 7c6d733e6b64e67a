"""Histograms observed from the event loop's thread only, without the locks of prometheus_client's.

A labelled Histogram's `observe` takes two locks (its sum's and a bucket's) and walks its bounds in
Python: 1.67 µs, where this one's bisect and two additions take about a fifth of that. Every
stream observes two (its queue wait and its time to the first token), so the difference is part of
a stream's set-up CPU (docs/bench-streams.md, sixth pass). The samples are prometheus_client's
(buckets, count, sum per label set), less the `_created` series. The inter-token gaps are observed
once per token, each stream through its model's child's `observe`, taken once.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector


class LoopHistogramChild:
    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are "less than or equal": bisect_left puts a value equal to a bound in it.
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def samples(self) -> tuple[list[tuple[str, float]], float]:
        """The cumulative buckets and the sum, as HistogramMetricFamily takes them."""
        buckets: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip([*map(str, self._bounds), "+Inf"], self._counts, strict=True):
            total += count
            buckets.append((bound, total))
        return buckets, self._sum


class LabelledLoopHistogram(Collector):
    """`Histogram(name, documentation, labelnames, buckets=...)` for the loop's thread."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = list(labelnames)
        # Prometheus writes a bound as a float ("1.0", not "1"): the same strings as a Histogram's.
        self._bounds = [float(b) for b in buckets]
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> LoopHistogramChild:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = LoopHistogramChild(self._bounds)
        return found

    def describe(self) -> Iterable[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in list(self._children.items()):
            buckets, total = child.samples()
            family.add_metric(list(values), buckets, total)
        yield family
