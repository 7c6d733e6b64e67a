"""One simulated run: traffic into the edge, the edge onto the GPU group's replicas, the autoscaler
on the edge's signal. `run` returns the recorder and the autoscaler's actions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import simpy

from bench.fleet import gpu_figures, step_curve, terraform, tiers
from bench.fleet.autoscaler import Autoscaler, Signal
from bench.fleet.edge_queue import EdgeQueue
from bench.fleet.gpu_group import GpuGroup, HostTiming
from bench.fleet.recorder import Recorder
from bench.fleet.replica import Batching, Replica
from bench.fleet.traffic import DailyCurve, TrafficSpec, requests


@dataclass(frozen=True)
class Scenario:
    name: str
    scaling: terraform.ScalingSettings
    traffic: TrafficSpec = field(default_factory=TrafficSpec)
    curve: DailyCurve = field(default_factory=DailyCurve)
    batching: Batching = "continuous"
    reserved_paid_fraction: float | None = None  # None: edge/defaults.toml's
    # "work": GPU time asked for per second at a full batch / GPUs in service (linear in load), what
    # edge/scaling/ publishes; "slots": (in flight + queued + turned away) / sequences, the one before.
    signal: Signal = "work"
    initial_hosts: int | None = None  # None: what the first minute's traffic needs at the target
    timing: HostTiming = field(default_factory=HostTiming)
    gpus_per_host: int = gpu_figures.GPUS_PER_HOST
    curve_model: step_curve.StepCurve = field(default_factory=step_curve.h200_llama70b)


@dataclass
class Outcome:
    scenario: Scenario
    recorder: Recorder
    actions: list[tuple[float, str, int]]

    @property
    def dollars_per_million_tokens(self) -> float:
        hours = self.recorder.gpu_seconds / 3600.0
        return hours * gpu_figures.DOLLARS_PER_GPU_HOUR / max(self.recorder.tokens, 1.0) * 1e6


def _hosts_for(scenario: Scenario, rate: float) -> int:
    """Hosts that serve `rate` simulated requests/s at the demand target (the day's start)."""
    c = scenario.curve_model
    per_gpu = 1.0 / c.request_gpu_s(1000, 500, c.max_sequences)  # real requests/s of a full GPU
    real = rate * scenario.traffic.bundle
    return max(1, math.ceil(real / (per_gpu * scenario.gpus_per_host * scenario.scaling.demand_target)))


def run(scenario: Scenario) -> Outcome:
    env = simpy.Environment(initial_time=scenario.traffic.start_s)
    edge_settings = tiers.read()
    bundle = scenario.traffic.bundle
    recorder = Recorder(bundle)
    s = scenario.scaling
    gpus = scenario.gpus_per_host

    def make_replicas() -> list[Replica]:
        if scenario.batching == "continuous":  # one engine per GPU, balanced: one replica of 8
            return [Replica(scenario.curve_model, gpus, bundle, "continuous")]
        return [Replica(scenario.curve_model, 1, bundle, "static") for _ in range(gpus)]

    edge: EdgeQueue | None = None

    def on_change() -> None:
        if edge is not None:
            edge.dispatch()

    group = GpuGroup(
        env,
        make_replicas,
        scenario.curve_model,
        gpus,
        s.min_size,
        s.max_size,
        s.warm_pool_min_size,
        s.scale_in_drain_s,
        scenario.timing,
        on_change,
        s.prepared_capacity,
    )
    edge = EdgeQueue(env, edge_settings, group, recorder, scenario.reserved_paid_fraction)
    first_rate = scenario.traffic.rate(scenario.curve, scenario.traffic.start_s)
    group.start(
        scenario.initial_hosts if scenario.initial_hosts is not None else _hosts_for(scenario, first_rate)
    )
    scaler = Autoscaler(env, s, group, edge, recorder, scenario.signal)
    env.process(scaler.run())
    max_tokens = {name: t.max_tokens for name, t in edge_settings.tiers.items()}

    def feed() -> simpy.events.ProcessGenerator:
        for req in requests(scenario.traffic, scenario.curve, max_tokens):
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            edge.arrive(req)

    env.process(feed())
    env.run(until=scenario.traffic.start_s + scenario.traffic.duration_s)
    return Outcome(scenario, recorder, scaler.actions)
