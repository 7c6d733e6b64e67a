"""The lock-free inter-token histogram exposes what prometheus_client's Histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from edge.loop_histogram import LabelledLoopHistogram

BUCKETS = (0.001, 0.01, 0.1)
VALUES = [0.0005, 0.001, 0.0011, 0.01, 0.05, 0.1, 2.0]


def test_loop_histogram_exposes_the_same_samples_as_a_locked_histogram() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LabelledLoopHistogram("itl_seconds", "Between tokens.", ["model"], BUCKETS, registry=ours)
    locked = Histogram("itl_seconds", "Between tokens.", ["model"], buckets=BUCKETS, registry=theirs)
    for model in ("small", "large"):
        observe = loop.labels(model).observe
        for value in VALUES:
            observe(value)
            locked.labels(model).observe(value)

    def samples(registry: CollectorRegistry) -> list[str]:
        return [
            line
            for line in generate_latest(registry).decode().splitlines()
            if line.startswith("itl_seconds") and "_created" not in line
        ]

    assert samples(ours) == samples(theirs)
    assert 'itl_seconds_bucket{le="0.001",model="small"} 2.0' in samples(
        ours
    )  # a bound's own value is inside it
