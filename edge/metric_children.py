"""A labelled Prometheus child, looked up once per label values.

`metric.labels(...)` rebuilds the label tuple (a generator over `str()`), takes the metric's lock
and looks the child up, on every call: several times per request (prompt tokens, queue wait, the
request's outcome, generated tokens, TTFT). The children of these metrics never change once made
(nothing removes their label sets; the replica gauges, which are removed, do not come through
here), so a plain dict keyed by the metric and the values returns the same child.

Bounded by what Prometheus itself keeps: one entry per label set ever used (tiers, outcomes:
configuration, not request data).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

C = TypeVar("C", covariant=True)


class _Labelled(Protocol[C]):
    """prometheus_client's metrics and edge/loop_histogram.py's: `labels` gives the child."""

    def labels(self, *values: str) -> C: ...


_CHILDREN: dict[tuple[Any, tuple[str, ...]], Any] = {}


def child(metric: _Labelled[C], *values: str) -> C:
    """`metric.labels(*values)`, cached."""
    key = (metric, values)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*values)
    return found
