"""Demand per replica: the GPU work this edge is asked for per second, over the replicas in service.

    DemandPerReplica = (replica-seconds asked for since the last sample / SAMPLE_INTERVAL_S)
                       / live replicas (1 with none)

* Asked for: every request that reached the admission queue (past the limiter), served or not:
  its prompt tokens and a mean reply, priced at a full batch (work.py). A request turned away
  (queue full, wait too long, no replica) still asked: with no live replica every request is
  refused as no_replica and the signal still reads the demand, in replicas wanted, so the
  scale-from-zero alarm starts a host on it.
* Asked for once: a client's retry (it says so: edge/retry_count.py) that the queue refuses again
  is not counted, since its first try was. Counted per try, clients obeying a no_replica's
  Retry-After (1 s) while a first host boots (minutes) multiplied the demand, and the size the
  group scaled out to, by their tries: 6 OpenAI SDK clients at their two default retries read as
  18 requests (tests/scaling/test_retries_are_not_demand.py). A retry the queue takes is counted
  (its earlier try may have been refused by the limiter, never counted here), so a request the
  queue refused and then took counts twice at most.
* Linear in load: 1.0 means the replicas in service are all needed at their full-batch throughput.
  The number of sequences the replicas hold is not linear under continuous batching (a replica at
  80 % of its output holds 39 % of its sequences, docs/bench-fleet.md), and a signal built on it
  oscillates; this one does not depend on where the requests wait (edge queue, Triton's queue,
  refused), so an edge fleet that over-fills its replicas after scaling out on CPU reads the same.
* Over the nominal sample interval, not the seconds since the last sample: the policies divide a
  period's Sum by SAMPLES_PER_PERIOD, so a period's value is then the work asked for in it however
  often the edge sampled. A rate per sample read 5/6 of the demand for a minute with a sample
  skipped (a slow PutMetricData call holds the publisher's loop up) and twice it sampled every 5 s
  (`cloudwatch_interval_s` under 10).

`ReplicaLoadPerReplica` is the replicas' own running + waiting sequences over their sequences.
The policies track the MAX of the two: GPUs that report a full batch and a queue read at least 1.0
whatever the edges think they asked (work no edge accounts for: an edge that died with streams
open, a price set too low), so saturated GPUs never scale in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prometheus_client import Gauge

from edge.admission.replica_set import ReplicaState
from edge.scaling import metric
from edge.scaling.work import WorkPrice

# By model: each served model has its own replicas and its own signal, and one unlabelled series
# showed whichever model's publisher had sampled last (the observability review: 1.98 two seconds
# in ten, the idle model's 0.0 the rest).
DEMAND = Gauge(
    "floodgate_scaling_demand_per_replica",
    "This edge's last scaling sample: replica-seconds asked for since the sample before, per 10 s"
    " (the sample interval), / live replicas.",
    ["model"],
)
REPLICA_LOAD = Gauge(
    "floodgate_scaling_replica_load_per_replica",
    "The replicas' own running + waiting sequences / their sequences, at the last scaling sample.",
    ["model"],
)


class DispatcherView(Protocol):
    """What the signal reads from the dispatcher (edge/admission/dispatcher.py), read-only."""

    def replica_states(self) -> Sequence[ReplicaState]: ...

    def offered(self) -> tuple[int, int]: ...


class DemandSignal:
    def __init__(
        self,
        dispatcher: DispatcherView,
        price: WorkPrice | None = None,
        model: str = "",
    ) -> None:
        self._dispatcher = dispatcher
        self._demand_gauge = DEMAND.labels(model=model)
        self._load_gauge = REPLICA_LOAD.labels(model=model)
        self._price = price or WorkPrice()
        self._offered_seen = dispatcher.offered()
        self._replica_sequences = 1  # one replica's max_sequences, last seen

    def sample(self) -> dict[str, float]:
        """This instant's figures, by metric name: the work asked for since the previous sample."""
        requests, prompt_tokens = offered = self._dispatcher.offered()
        asked = self._price.gpu_s(requests - self._offered_seen[0], prompt_tokens - self._offered_seen[1])
        self._offered_seen = offered
        states = self._dispatcher.replica_states()
        live = [s.capacity for s in states if s.alive and s.capacity is not None]
        if live:
            self._replica_sequences = max(c.max_sequences for c in live) or 1
        sequences = sum(c.max_sequences for c in live) or self._replica_sequences
        reported = sum(c.running + c.waiting for c in live)
        sample = {
            metric.DEMAND_METRIC: asked / metric.SAMPLE_INTERVAL_S / max(1, len(live)),
            metric.REPLICA_LOAD_METRIC: reported / sequences,
        }
        self._demand_gauge.set(sample[metric.DEMAND_METRIC])
        self._load_gauge.set(sample[metric.REPLICA_LOAD_METRIC])
        return sample
