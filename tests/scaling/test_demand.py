"""The scaling signal (edge/scaling/demand.py): the work asked for per replica, linear in load;
what it reads when GPUs saturate with the edge queue empty, when requests are turned away, and
with no replica at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from edge.admission.dispatcher import Dispatcher
from edge.admission.replica_set import ReplicaState
from edge.admission.ticket import Overloaded, Ticket
from edge.config import load_settings
from edge.models.served import served_models
from edge.scaling import DemandSignal, WorkPrice, metric, work_price
from edge.upstreams.base import Capacity
from tests.admission.replicas import ControlledUpstream

pytestmark = pytest.mark.anyio

SEQUENCES = 64  # one replica's max_sequences
# Round prices: a request of 1000 prompt tokens and a 500-token reply costs 0.1 + 0.5 = 0.6 s.
PRICE = WorkPrice(prefill_s_per_token=1e-4, decode_s_per_token=1e-3, mean_reply_tokens=500)
REQUEST_S = 0.6
INTERVAL_S = metric.SAMPLE_INTERVAL_S


@dataclass
class Edge:
    """One edge instance's admission state as the dispatcher reports it (edge/admission)."""

    states: list[ReplicaState]
    requests: int = 0  # asked for a replica since start
    prompt_tokens: int = 0
    held: dict[str, int] = field(default_factory=dict)

    def replica_states(self) -> Sequence[ReplicaState]:
        return self.states

    def offered(self) -> tuple[int, int]:
        return self.requests, self.prompt_tokens

    def ask(self, requests: int, prompt_tokens_each: int = 1000) -> None:
        self.requests += requests
        self.prompt_tokens += requests * prompt_tokens_each


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


def period(edge: Edge, signal: DemandSignal, requests_per_s: float) -> list[dict[str, float]]:
    """One period of samples while `edge` is asked `requests_per_s` requests of 1000 prompt tokens."""
    samples = []
    for _ in range(metric.SAMPLES_PER_PERIOD):
        edge.ask(round(requests_per_s * INTERVAL_S))
        samples.append(signal.sample())
    return samples


def test_saturated_gpus_with_an_empty_edge_queue_do_not_scale_in() -> None:
    # docs/deploy.md's worked example: 4 replicas of 64 sequences, two edges (the service scaled
    # out on CPU) that together hold 150 streams on every replica: 64 running, 86 queued inside
    # TensorRT-LLM. Both edge queues are empty. The requests they are asked for: 3 per second each
    # at 0.6 replica-seconds, 1.8 replica-seconds per second per edge over 4 replicas.
    edges = [Edge(replicas(4, running=64, waiting=86, held_each=75)) for _ in range(2)]
    signals = [DemandSignal(e, PRICE) for e in edges]

    samples = [s for e, signal in zip(edges, signals, strict=True) for s in period(e, signal, 3)]

    assert samples[0][metric.DEMAND_METRIC] == pytest.approx(3 * REQUEST_S / 4)
    # The edges' demand alone (0.9) would not hold 4 replicas of a full batch plus a queue at a
    # target of 0.8 for long; the replicas' own load (150 / 64 = 2.34) does: out, never in.
    assert fleet_value(samples) == pytest.approx(150 / 64)
    assert fleet_value(samples) > 0.8


def test_the_signal_is_linear_in_the_work_asked_for() -> None:
    # Twice the requests read twice the demand, whatever the replicas hold right now.
    values = []
    for rate in (1.0, 2.0):
        edge = Edge(replicas(4, running=4, waiting=0, held_each=4))
        values.append(fleet_value(period(edge, DemandSignal(edge, PRICE), rate)))
    assert values[0] == pytest.approx(REQUEST_S / 4)
    assert values[1] == pytest.approx(2 * values[0])


def test_prompt_tokens_are_priced_at_the_prefill_cost() -> None:
    edge = Edge(replicas(1, running=0, waiting=0, held_each=0))
    signal = DemandSignal(edge, PRICE)
    edge.ask(10, prompt_tokens_each=3000)

    demand = signal.sample()[metric.DEMAND_METRIC]

    assert demand == pytest.approx(10 * (3000 * 1e-4 + 500 * 1e-3) / INTERVAL_S)
    assert REGISTRY.get_sample_value("floodgate_scaling_demand_per_replica", {"model": ""}) == pytest.approx(
        demand
    )


def test_a_models_own_prices_price_its_demand_the_others_keep_the_defaults() -> None:
    # Two models on different GPUs: the small one's replicas cost far less per token than the
    # [metrics] defaults (one H200 serving a 70B), and its group scales on its own demand.
    models = {
        "small": {"source": "demo", "prefill_s_per_token": 2e-5, "decode_s_per_token": 5e-5},
        "large": {"source": "demo"},
    }
    settings = load_settings(overrides={"models": models})
    defaults = settings.metrics
    demand = {}
    for model in served_models(settings):
        edge = Edge(replicas(1, running=0, waiting=0, held_each=0))
        signal = DemandSignal(edge, work_price(model.settings.metrics), model=model.name)
        edge.ask(10, prompt_tokens_each=3000)
        demand[model.name] = signal.sample()[metric.DEMAND_METRIC]
    # Each model's own series on /metrics: one unlabelled gauge showed the last sampled model's.
    assert {
        name: REGISTRY.get_sample_value("floodgate_scaling_demand_per_replica", {"model": name})
        for name in demand
    } == demand

    assert demand["small"] == pytest.approx(10 * (3000 * 2e-5 + 500 * 5e-5) / INTERVAL_S)
    assert demand["large"] == pytest.approx(
        10 * (3000 * defaults.prefill_s_per_token + 500 * defaults.decode_s_per_token) / INTERVAL_S
    )
    assert (defaults.prefill_s_per_token, defaults.decode_s_per_token) == (1.28e-4, 2.16e-4)


def test_the_replicas_own_load_counts_work_no_edge_accounts_for() -> None:
    # An edge that died left 40 streams running on each replica; this edge holds 10 on each.
    edge = Edge(replicas(2, running=50, waiting=0, held_each=10))

    sample = period(edge, DemandSignal(edge, PRICE), 0)[-1]

    assert sample[metric.DEMAND_METRIC] == 0.0
    assert sample[metric.REPLICA_LOAD_METRIC] == pytest.approx(100 / 128)


async def test_with_no_replica_the_refused_requests_are_the_demand() -> None:
    # A real dispatcher with no replica: every request is refused (no_replica), and the signal
    # still reads demand, in replicas wanted, which the scale-from-zero alarm acts on.
    dispatcher = Dispatcher([], reserved_paid_fraction=0.1, max_queue=10)
    await dispatcher.start()
    signal = DemandSignal(dispatcher, PRICE)
    ticket = Ticket(
        "r1", "u1", priority=1, kv_tokens=1100, max_wait_s=5, may_use_reserve=True, prompt_tokens=1000
    )
    try:
        for _ in range(3):
            with pytest.raises(Overloaded, match="no_replica"):
                dispatcher.precheck(ticket)
        sample = signal.sample()
    finally:
        await dispatcher.aclose()

    assert dispatcher.offered() == (3, 3000)
    assert sample[metric.DEMAND_METRIC] == pytest.approx(
        3 * REQUEST_S / INTERVAL_S
    )  # over one stand-in replica
    assert sample[metric.REPLICA_LOAD_METRIC] == 0.0


@pytest.mark.parametrize(
    "sampled_after_s",
    [
        [10.0] * 6,
        [10.0, 10.0, 20.0, 10.0, 10.0],  # one sample skipped: a PutMetricData call held the loop up
        [5.0] * 12,  # cloudwatch_interval_s = 5: the publisher samples every 5 s
        [60.0],
    ],
)
def test_a_periods_value_is_the_work_asked_whenever_the_edge_sampled(sampled_after_s: list[float]) -> None:
    # The policies divide a period's Sum by SAMPLES_PER_PERIOD. A rate per sample read 5/6 of the
    # demand for a minute with a sample skipped, and twice the demand sampled every 5 s: the group
    # ran twice the GPUs it needed.
    edge = Edge(replicas(4, running=4, waiting=0, held_each=4))
    signal = DemandSignal(edge, PRICE)
    samples = []
    for step in sampled_after_s:
        edge.ask(round(3 * step))
        samples.append(signal.sample())

    assert fleet_value(samples) == pytest.approx(3 * REQUEST_S / 4)


async def test_a_retry_counts_where_the_queue_takes_it_and_not_where_it_refuses_it_again() -> None:
    # A retry whose earlier try the limiter refused was never counted: taken, it is demand. Refused
    # again by the queue, it is not (its first try was counted): tests/scaling/
    # test_retries_are_not_demand.py has the edge and the clients.
    replica = ControlledUpstream("r")
    dispatcher = Dispatcher([replica], reserved_paid_fraction=0.0, max_queue=10)
    await dispatcher.start()

    def retry(kv_tokens: int) -> Ticket:
        return Ticket(
            "r", "u1", 1, kv_tokens, max_wait_s=5, may_use_reserve=True, prompt_tokens=100, retry=True
        )

    try:
        dispatcher.precheck(retry(kv_tokens=200))
        assert dispatcher.offered() == (1, 100)
        replica.is_ready = False  # the only replica fails its health check: no_replica
        await dispatcher.check_replicas()
        with pytest.raises(Overloaded, match="no_replica"):
            dispatcher.precheck(retry(kv_tokens=200))
    finally:
        await dispatcher.aclose()

    assert dispatcher.offered() == (1, 100)
