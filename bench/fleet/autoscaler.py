"""The group's three policies as iac/modules/gpu_pool/scaling.tf defines them, played the way AWS
documents them, on the signal edge/scaling/ publishes:

* the signal ("work", deployed): every SAMPLE_INTERVAL the edges sample the GPU time the requests
  past the limiter asked for since the last sample (prompt tokens x prefill cost + mean reply x
  decode cost at a full batch, edge/scaling/work.py), per second, over the GPUs in service (1 host's
  worth with none); a period's value is the Sum of its samples over samples_per_period, MAX'ed with
  the replicas' own load (running / sequences).
* target tracking at demand_target: AWS's alarms want 3 periods above the target to scale out and
  15 below it to scale in; the new capacity is ceil(in service x metric / target), never below what
  is already wanted while hosts warm up, and no scale-in while a host is still warming up
  (estimated_instance_warmup).
* the step policy: surge_datapoints periods at or above surge_demand add the step's percent of the
  desired capacity (at least one host), then wait out the warm-up before stepping again.
* from zero: demand with no host wanted starts one.

`signal="slots"` is the signal before it, for the comparison docs/scale.md draws: (in flight +
queued + turned away since the last sample) / (sequences of the replicas in service), which under
continuous batching is not proportional to load and oscillates.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

import simpy

from bench.fleet.edge_queue import EdgeQueue
from bench.fleet.gpu_group import GpuGroup, State
from bench.fleet.recorder import Recorder
from bench.fleet.terraform import ScalingSettings

SCALE_OUT_PERIODS = 3  # AWS target tracking: the high alarm's datapoints
SCALE_IN_PERIODS = 15  # AWS target tracking: the low alarm's datapoints

Signal = Literal["slots", "work"]


class Autoscaler:
    def __init__(
        self,
        env: simpy.Environment,
        settings: ScalingSettings,
        group: GpuGroup,
        edge: EdgeQueue,
        recorder: Recorder,
        signal: Signal = "work",
    ) -> None:
        self.signal = signal
        self._offered_seen = 0.0
        self.env = env
        self.s = settings
        self.group = group
        self.edge = edge
        self.recorder = recorder
        self.periods: deque[float] = deque(maxlen=SCALE_IN_PERIODS)
        self._turned_seen = 0
        self._last_step = -1e18
        self.actions: list[tuple[float, str, int]] = []  # (time, policy, new desired)

    def sample(self) -> tuple[float, float]:
        """One edge-fleet sample: (demand per replica, replica load per replica)."""
        capacity = sum(r.slots for h in self.group.in_service() for r in h.replicas)
        if capacity == 0:
            capacity = sum(r.slots for r in self.group.hosts[0].replicas) if self.group.hosts else 1
        turned = self.edge.turned_away - self._turned_seen
        self._turned_seen = self.edge.turned_away
        running = sum(r.running for h in self.group.in_service() for r in h.replicas)
        if self.signal == "work":
            gpus = max(1, len(self.group.in_service())) * self.group.gpus_per_host
            asked = self.edge.offered_gpu_s - self._offered_seen
            self._offered_seen = self.edge.offered_gpu_s
            interval = self.s.metric_period_s / self.s.samples_per_period
            return asked * self.group_bundle() / interval / gpus, running / capacity
        return (self.edge.in_flight + self.edge.queued() + turned) / capacity, running / capacity

    def group_bundle(self) -> int:
        return self.recorder.bundle

    def run(self) -> simpy.events.ProcessGenerator:
        interval = self.s.metric_period_s / self.s.samples_per_period
        while True:
            demand_sum, load_max, busy = 0.0, 0.0, 0.0
            for _ in range(self.s.samples_per_period):
                yield self.env.timeout(interval)
                self.edge.expire()
                demand, load = self.sample()
                demand_sum += demand
                load_max = max(load_max, load)
                busy += self._busy()
            metric = max(demand_sum / self.s.samples_per_period, load_max)
            self.periods.append(metric)
            self._evaluate(metric, demand_sum)
            self._record(metric, busy / self.s.samples_per_period)

    def _evaluate(self, metric: float, demand_sum: float) -> None:
        g = self.group
        in_service = len(g.in_service())
        if g.desired < 1 and demand_sum > 0:
            self._act("from_zero", 1)
            return
        recent = list(self.periods)
        # Step policy first: its larger jumps are for bursts target tracking follows too slowly.
        surge = recent[-self.s.surge_datapoints :]
        if (
            len(surge) == self.s.surge_datapoints
            and all(m >= self.s.surge_demand for m in surge)
            and self.env.now - self._last_step >= self.s.instance_warmup_s
        ):
            breach = metric - self.s.surge_demand
            percent = next(
                (p for lo, hi, p in self.s.surge_steps if breach >= lo and (hi is None or breach < hi)),
                self.s.surge_steps[-1][2],
            )
            self._last_step = self.env.now
            self._act("step", g.desired + max(1, math.ceil(g.desired * percent / 100)))
            return
        wanted = math.ceil(max(in_service, 1) * metric / self.s.demand_target)
        high = recent[-SCALE_OUT_PERIODS:]
        if len(high) == SCALE_OUT_PERIODS and all(m > self.s.demand_target for m in high):
            if wanted > g.desired:
                self._act("target_out", wanted)
        elif (
            len(recent) == SCALE_IN_PERIODS
            and all(m < self.s.demand_target for m in recent)
            and wanted < g.desired
            and not g.warming()
            and self.env.now - g.last_scale_out >= self.s.instance_warmup_s
        ):
            self._act("target_in", wanted)

    def _act(self, policy: str, desired: int) -> None:
        before = self.group.desired
        self.group.set_desired(desired)
        if self.group.desired != before:
            self.actions.append((self.env.now, policy, self.group.desired))

    def _busy(self) -> float:
        """The hosts in service's work over their full-batch work (Replica.busy_fraction), by GPU."""
        replicas = [r for h in self.group.in_service() for r in h.replicas]
        gpus = sum(r.gpus for r in replicas)
        return sum(r.busy_fraction() * r.gpus for r in replicas) / gpus if gpus else 0.0

    def _record(self, metric: float, busy: float) -> None:
        g = self.group
        m = self.recorder.minute(self.env.now - 1e-9)
        hosts = g.in_service()
        slots = sum(r.slots for h in hosts for r in h.replicas)
        running = sum(r.running for h in hosts for r in h.replicas)
        full = sum(r.max_tokens_per_s() for h in hosts for r in h.replicas)
        m.gpus_in_service = len(hosts) * g.gpus_per_host
        m.gpus_billed = g.billed_gpus()
        m.warm_hosts = g.count(State.WARM)
        m.desired_hosts = g.desired
        m.occupancy = running / slots if slots else 0.0
        m.full_tokens_per_s = full
        m.utilisation = busy
        m.demand = metric
        self.recorder.gpu_seconds += g.billed_gpus() * self.s.metric_period_s
