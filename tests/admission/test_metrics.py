"""The admission metrics the dashboards and the autoscaler read."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from edge.admission import Overloaded
from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket
from tests.admission.replicas import ControlledUpstream


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.anyio
async def test_queue_depth_utilisation_wait_and_rejections_are_exported(
    make_dispatcher: MakeDispatcher,
) -> None:
    replica = ControlledUpstream("metrics-r1", kv_tokens_total=1000, max_sequences=2)
    async with make_dispatcher([replica], max_queue=3, model="metrics-model") as dispatcher:
        flow = Flow(dispatcher)
        waits_before = sample(
            "floodgate_queue_wait_seconds_count", model="metrics-model", tier="metrics-tier"
        )
        # Which model's queue turned a request away (an edge serving several has a queue each).
        rejected_before = sample("floodgate_queue_rejected_total", model="metrics-model", reason="queue_full")
        for i in range(5):
            flow.submit(ticket(f"u{i}", kv_tokens=250, tier="metrics-tier"))
        await flow.settle()

        assert sample("floodgate_queue_depth", model="metrics-model", tier="metrics-tier") == 3
        assert sample("floodgate_queue_depth_per_replica", model="metrics-model") == 3.0
        assert sample("floodgate_replica_kv_utilisation", model="metrics-model", replica="metrics-r1") == 0.5
        assert (
            sample("floodgate_queue_wait_seconds_count", model="metrics-model", tier="metrics-tier")
            == waits_before + 2
        )
        with pytest.raises(Overloaded):
            dispatcher.precheck(ticket("late", tier="metrics-tier"))
        assert (
            sample("floodgate_queue_rejected_total", model="metrics-model", reason="queue_full")
            == rejected_before + 1
        )
        await flow.aclose()
        assert sample("floodgate_queue_depth", model="metrics-model", tier="metrics-tier") == 0
        # Scaled in: its gauge goes, removed under the labels it was set with (model and replica).
        dispatcher.remove_upstream("metrics-r1")
        labels = {"model": "metrics-model", "replica": "metrics-r1"}
        assert REGISTRY.get_sample_value("floodgate_replica_kv_utilisation", labels) is None


@pytest.mark.anyio
async def test_tiers_of_one_priority_each_report_their_own_queue_depth(
    make_dispatcher: MakeDispatcher,
) -> None:
    """Two tiers may share a priority (one queue, served round robin by user): each tier's gauge
    counts its own waiting requests, not the shared queue's."""
    replica = ControlledUpstream("metrics-r2", kv_tokens_total=1000, max_sequences=1)
    async with make_dispatcher([replica]) as dispatcher:
        flow = Flow(dispatcher)
        flow.submit(ticket("runs", kv_tokens=250, tier="pro-a"))
        for i in range(3):
            flow.submit(ticket(f"a{i}", kv_tokens=250, tier="pro-a"))
        flow.submit(ticket("b0", kv_tokens=250, tier="pro-b"))
        await flow.settle()

        assert sample("floodgate_queue_depth", model="", tier="pro-a") == 3
        assert sample("floodgate_queue_depth", model="", tier="pro-b") == 1
        await flow.aclose()
