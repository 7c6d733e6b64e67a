"""Demand per replica: what one edge is asked for, over what the replicas it sees can hold.

    demand = in flight + queued + turned away since the last sample
    DemandPerReplica = demand / (sum of max_sequences over the live replicas)

* In flight: this edge's requests holding a replica, whether the replica runs them or queues them
  inside TensorRT-LLM (an edge that fills more than its share, because the service scaled out on
  CPU, still counts every request it sent). Saturated GPUs with an empty edge queue therefore read
  about 1.0, not 0: the group does not scale in under full load.
* Queued: waiting in this edge's admission queue.
* Turned away: refused since the last sample (queue full, wait too long, no replica). With no
  live replica every request is refused as no_replica, so the signal still reads the demand:
  the scale-from-zero alarm starts a host on it.
* Capacity: each live replica's max_sequences, as it reports it (the whole replica, not this edge's
  share: summing the edges' samples then divides the fleet's demand by the fleet's capacity). With
  no live replica, one replica of the last size seen stands in (1 before any was seen), so the
  figure stays finite and positive.

`ReplicaLoadPerReplica` is the replicas' own running + waiting sequences over the same capacity:
work the edges do not account for (an edge that died with streams open) still counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prometheus_client import Gauge

from edge.admission.replica_set import ReplicaState
from edge.scaling import metric

DEMAND = Gauge(
    "floodgate_scaling_demand_per_replica",
    "This edge's last scaling sample: (in flight + queued + turned away) / live replicas' sequences.",
)
REPLICA_LOAD = Gauge(
    "floodgate_scaling_replica_load_per_replica",
    "The replicas' own running + waiting sequences / their sequences, at the last scaling sample.",
)


class DispatcherView(Protocol):
    """What the signal reads from the dispatcher (edge/admission/dispatcher.py), read-only."""

    def replica_states(self) -> Sequence[ReplicaState]: ...

    def queue_depth(self) -> int: ...

    def turned_away(self) -> int: ...


class DemandSignal:
    def __init__(self, dispatcher: DispatcherView) -> None:
        self._dispatcher = dispatcher
        self._turned_away_seen = dispatcher.turned_away()
        self._replica_sequences = 1  # one replica's max_sequences, last seen

    def sample(self) -> dict[str, float]:
        """This instant's figures, by metric name. Counts refusals since the previous sample."""
        states = self._dispatcher.replica_states()
        turned_away = self._dispatcher.turned_away()
        recently_turned_away = turned_away - self._turned_away_seen
        self._turned_away_seen = turned_away
        live = [s.capacity for s in states if s.alive and s.capacity is not None]
        if live:
            self._replica_sequences = max(c.max_sequences for c in live) or 1
        capacity = sum(c.max_sequences for c in live) or self._replica_sequences
        in_flight = sum(s.sequences_held for s in states)
        demand = in_flight + self._dispatcher.queue_depth() + recently_turned_away
        reported = sum(c.running + c.waiting for c in live)
        sample = {
            metric.DEMAND_METRIC: demand / capacity,
            metric.REPLICA_LOAD_METRIC: reported / capacity,
        }
        DEMAND.set(sample[metric.DEMAND_METRIC])
        REPLICA_LOAD.set(sample[metric.REPLICA_LOAD_METRIC])
        return sample
