"""edge/metrics.py's LoopGauge: served exactly as prometheus_client's Gauge it replaces."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from edge.metrics import LoopGauge


def test_a_loop_gauge_is_exposed_byte_for_byte_as_a_gauge() -> None:
    plain, loop = CollectorRegistry(), CollectorRegistry()
    gauges = [
        Gauge("x_open", "Open things.", registry=plain),
        LoopGauge("x_open", "Open things.", registry=loop),
    ]
    for gauge in gauges:
        gauge.inc()
        gauge.inc(2.5)
        gauge.dec()
    assert generate_latest(loop) == generate_latest(plain)
    assert b"x_open 2.5\n" in generate_latest(loop)
