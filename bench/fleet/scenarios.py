"""The comparisons `python -m bench.fleet` runs: the Terraform as it is on the deployed signal, then
one change at a time (max_size, the target, the surge step, the warm pool, batching, the reserved
paid share), and the sequences-based signal the work signal replaced,
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
SEQUENCES_SIGNAL = "sequences signal (before)"


def day(bundle: int, groups: int = 100, hours: float = 24.0, start_h: float = 0.0) -> TrafficSpec:
    return TrafficSpec(
        groups=groups, bundle=bundle, start_s=start_h * 3600, duration_s=min(DAY_S, hours * 3600)
    )


def all_scenarios(bundle: int, hours: float = 24.0, start_h: float = 0.0) -> list[Scenario]:
    """The deployed signal (edge/scaling/: the GPU work asked for, MAX'ed with the replicas' load)
    with the Terraform as is, one change at a time, and the sequences-based signal it replaced."""
    tf = terraform.read()
    sized = tf.with_overrides(max_size=max(tf.max_size, SIZED_MAX))
    traffic = day(bundle, hours=hours, start_h=start_h)
    base = Scenario("terraform as is", tf, traffic)
    big = replace(base, name=f"max_size {sized.max_size}", scaling=sized)
    before = replace(base, name=SEQUENCES_SIGNAL, signal="slots")
    before_big = replace(before, name=f"sequences signal, max_size {sized.max_size}", scaling=sized)
    return [
        base,
        big,
        replace(big, name="target 0.7", scaling=sized.with_overrides(demand_target=0.7)),
        replace(big, name="target 0.9", scaling=sized.with_overrides(demand_target=0.9)),
        replace(big, name="no surge step", scaling=sized.with_overrides(surge_demand=1e9)),
        replace(big, name="surge at 1.2", scaling=sized.with_overrides(surge_demand=1.2)),
        replace(big, name="no warm pool", timing=HostTiming(warm_start_s=HostTiming().cold_start_s)),
        # AWS's default pool (warm_pool_max_prepared = -1): max_size - desired hosts wait warm.
        replace(big, name="warm pool to max_size", scaling=sized.with_overrides(warm_pool_max_prepared=-1)),
        replace(big, name="static batching", batching="static"),
        replace(base, name="reserved 0", reserved_paid_fraction=0.0),
        replace(base, name="reserved 0.4", reserved_paid_fraction=0.4),
        before,
        before_big,
        replace(before_big, name="sequences, target 0.6", scaling=sized.with_overrides(demand_target=0.6)),
        replace(before_big, name="sequences, target 0.9", scaling=sized.with_overrides(demand_target=0.9)),
    ]
