"""The scaling signal (edge/scaling/demand.py): what it reads when GPUs saturate, when the edge
queue fills, when requests are turned away, and with no replica at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from edge.admission.dispatcher import Dispatcher
from edge.admission.replica_set import ReplicaState
from edge.admission.ticket import Overloaded, Ticket
from edge.scaling import DemandSignal, metric
from edge.upstreams.base import Capacity

pytestmark = pytest.mark.anyio

SEQUENCES = 64  # one replica's max_sequences


@dataclass
class Edge:
    """One edge instance's admission state as the dispatcher reports it (edge/admission)."""

    states: list[ReplicaState]
    queued: int = 0
    refused: int = 0
    held: dict[str, int] = field(default_factory=dict)

    def replica_states(self) -> Sequence[ReplicaState]:
        return self.states

    def queue_depth(self) -> int:
        return self.queued

    def turned_away(self) -> int:
        return self.refused


def replicas(count: int, running: int, waiting: int, held_each: int) -> list[ReplicaState]:
    """`count` live replicas, each running `running` and queueing `waiting` sequences in
    TensorRT-LLM, `held_each` of them this edge's."""
    capacity = Capacity(
        kv_tokens_total=SEQUENCES * 4096,
        kv_tokens_used=running * 4096,
        max_sequences=SEQUENCES,
        running=running,
        waiting=waiting,
    )
    return [ReplicaState(f"r{i}", True, True, capacity, held_each * 4096, held_each) for i in range(count)]


def fleet_value(samples: list[dict[str, float]]) -> float:
    """What the Auto Scaling policy computes from one period: MAX([demand / samples, load])."""
    per_period = metric.SAMPLES_PER_PERIOD
    demand = sum(s[metric.DEMAND_METRIC] for s in samples) / per_period
    load = max(s[metric.REPLICA_LOAD_METRIC] for s in samples)
    return max(demand, load)


def test_saturated_gpus_with_an_empty_edge_queue_do_not_read_zero() -> None:
    # docs/deploy.md's worked example: 4 replicas of 64 sequences, two edges (the service scaled
    # out on CPU, each still assuming half of every replica) with 75 streams each on every replica:
    # 150 per replica, 64 running and 86 queued inside TensorRT-LLM. Both edge queues are empty.
    edges = [Edge(replicas(4, running=64, waiting=86, held_each=75)) for _ in range(2)]
    signals = [DemandSignal(e) for e in edges]

    samples = [s.sample() for s in signals for _ in range(metric.SAMPLES_PER_PERIOD)]

    # The old figure (requests waiting at the edge per replica) was 0: scale in, at full load.
    assert all(e.queue_depth() == 0 for e in edges)
    assert samples[0][metric.DEMAND_METRIC] == pytest.approx(300 / 256)
    assert fleet_value(samples) == pytest.approx(600 / 256)
    # Target tracking at 0.8 wants ceil(4 x 2.34 / 0.8) = 12 replicas: out, never in.
    assert fleet_value(samples) > 0.8


def test_demand_falls_only_when_replicas_have_room() -> None:
    edge = Edge(replicas(4, running=16, waiting=0, held_each=16))

    value = fleet_value([DemandSignal(edge).sample() for _ in range(metric.SAMPLES_PER_PERIOD)])

    assert value == pytest.approx(64 / 256)  # a quarter of every replica is wanted


def test_queued_and_turned_away_requests_count_once() -> None:
    edge = Edge(replicas(2, running=64, waiting=0, held_each=64), queued=20)
    signal = DemandSignal(edge)
    edge.refused = 12  # refused between two samples

    first = signal.sample()[metric.DEMAND_METRIC]
    second = signal.sample()[metric.DEMAND_METRIC]

    assert first == pytest.approx((128 + 20 + 12) / 128)
    assert second == pytest.approx((128 + 20) / 128)
    assert REGISTRY.get_sample_value("floodgate_scaling_demand_per_replica") == pytest.approx(second)


def test_the_replicas_own_load_counts_work_no_edge_accounts_for() -> None:
    # An edge that died left 40 streams running on each replica; this edge holds 10 on each.
    edge = Edge(replicas(2, running=50, waiting=0, held_each=10))

    sample = DemandSignal(edge).sample()

    assert sample[metric.DEMAND_METRIC] == pytest.approx(20 / 128)
    assert sample[metric.REPLICA_LOAD_METRIC] == pytest.approx(100 / 128)


async def test_with_no_replica_the_turned_away_requests_are_the_demand() -> None:
    # A real dispatcher with no replica: every request is refused (no_replica), and the signal
    # still reads demand, which the scale-from-zero alarm acts on.
    dispatcher = Dispatcher([], reserved_paid_fraction=0.1, max_queue=10)
    await dispatcher.start()
    signal = DemandSignal(dispatcher)
    ticket = Ticket("r1", "u1", priority=1, kv_tokens=100, max_wait_s=5, may_use_reserve=True)
    try:
        for _ in range(3):
            with pytest.raises(Overloaded, match="no_replica"):
                dispatcher.precheck(ticket)

        sample = signal.sample()
    finally:
        await dispatcher.aclose()

    assert dispatcher.turned_away() >= 3
    assert sample[metric.DEMAND_METRIC] == pytest.approx(3.0)  # over one stand-in replica of 1
    assert sample[metric.REPLICA_LOAD_METRIC] == 0.0


def test_with_no_live_replica_the_last_size_seen_stands_in() -> None:
    edge = Edge(replicas(1, running=0, waiting=0, held_each=0))
    signal = DemandSignal(edge)
    signal.sample()
    edge.states = [ReplicaState("r0", False, False, None, 0, 0)]
    edge.refused = 32

    assert signal.sample()[metric.DEMAND_METRIC] == pytest.approx(32 / SEQUENCES)
