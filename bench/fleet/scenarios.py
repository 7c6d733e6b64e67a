"""The comparisons `python -m bench.fleet` runs: the Terraform as it is, then one change at a time
(batching, the scaling signal, the target, the surge step, the warm pool, the reserved paid share),
all on the same day of traffic (same seed) for one GPU group serving 1/groups of the design's load."""

from __future__ import annotations

from dataclasses import replace

from bench.fleet import terraform
from bench.fleet.gpu_group import HostTiming
from bench.fleet.simulation import Scenario
from bench.fleet.traffic import DAY_S, TrafficSpec

# Hosts one group needs at the design's peak share (1/groups of 30K prompts/s): 300 real requests/s
# over ~34 per full 8 x H200 host is ~9 full hosts; the sweeps give the group room to 24.
SIZED_MAX = 24


def day(bundle: int, groups: int = 100, hours: float = 24.0, start_h: float = 0.0) -> TrafficSpec:
    return TrafficSpec(
        groups=groups, bundle=bundle, start_s=start_h * 3600, duration_s=min(DAY_S, hours * 3600)
    )


def all_scenarios(bundle: int, hours: float = 24.0, start_h: float = 0.0) -> list[Scenario]:
    tf = terraform.read()
    sized = tf.with_overrides(max_size=max(tf.max_size, SIZED_MAX))
    traffic = day(bundle, hours=hours, start_h=start_h)
    base = Scenario("terraform as is", tf, traffic)
    slots = replace(base, name=f"max_size {sized.max_size}", scaling=sized)
    work = replace(slots, name=f"work signal, max_size {sized.max_size}", signal="work")
    work8 = replace(base, name="work signal, max_size as is", signal="work")
    return [
        base,
        slots,
        replace(slots, name="target 0.6", scaling=sized.with_overrides(demand_target=0.6)),
        replace(slots, name="target 0.9", scaling=sized.with_overrides(demand_target=0.9)),
        work,
        replace(work, name="work, target 0.7", scaling=sized.with_overrides(demand_target=0.7)),
        replace(work, name="work, target 0.9", scaling=sized.with_overrides(demand_target=0.9)),
        replace(work, name="work, no surge step", scaling=sized.with_overrides(surge_demand=1e9)),
        replace(work, name="work, surge at 1.2", scaling=sized.with_overrides(surge_demand=1.2)),
        replace(work, name="work, no warm pool", timing=HostTiming(warm_start_s=HostTiming().cold_start_s)),
        replace(work, name="work, static batching", batching="static"),
        work8,
        replace(work8, name="work, max as is, reserved 0", reserved_paid_fraction=0.0),
        replace(work8, name="work, max as is, reserved 0.4", reserved_paid_fraction=0.4),
    ]
