"""edge/loop_histogram.py: the samples a labelled prometheus_client Histogram exposes
(less `_created`), per label set."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from edge.loop_histogram import LabelledLoopHistogram

BUCKETS = (0.005, 0.025, 0.1, 1, 2.5, 10, 120)  # ints too: written "1.0", as Prometheus does
VALUES = [0.0001, 0.005, 0.0051, 0.1, 0.99, 1.0, 7.5, 120.0, 500.0]


def test_labelled_loop_histogram_exposes_a_locked_histograms_samples() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LabelledLoopHistogram("wait_seconds", "Queue wait.", ["tier"], BUCKETS, registry=ours)
    locked = Histogram("wait_seconds", "Queue wait.", ["tier"], buckets=BUCKETS, registry=theirs)
    for i, value in enumerate(VALUES):
        tier = "free" if i % 3 else "paid"
        loop.labels(tier).observe(value)
        locked.labels(tier).observe(value)

    def lines(registry: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert lines(ours) == lines(theirs)
    assert 'wait_seconds_bucket{le="0.005",tier="paid"} 1.0' in lines(
        ours
    )  # a bound's own value is inside it
