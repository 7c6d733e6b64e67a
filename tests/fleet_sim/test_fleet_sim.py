"""The fleet simulation's behaviour on short runs (bench/fleet/): what its conclusions rest on."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import simpy

from bench.fleet import step_curve, terraform, tiers
from bench.fleet.autoscaler import SCALE_IN_PERIODS, Autoscaler
from bench.fleet.edge_queue import EdgeQueue
from bench.fleet.gpu_group import GpuGroup, HostTiming
from bench.fleet.recorder import Recorder
from bench.fleet.replica import Replica
from bench.fleet.simulation import Scenario, run
from bench.fleet.traffic import DailyCurve, TrafficSpec

REPO = Path(__file__).resolve().parents[2]
FLAT_FLOOD = DailyCurve(trough=0.5, high=0.5, bursts=())  # 15K prompts/s over the fleet


def small_flood(hosts: int, minutes: float = 6.0, **kw: object) -> Scenario:
    """One-GPU hosts, a fixed group of `hosts`, 1/1000 of a flat half-peak flood: ~15 requests/s
    against ~4 a host serves."""
    scaling = terraform.read().with_overrides(min_size=hosts, max_size=hosts, warm_pool_min_size=0)
    traffic = TrafficSpec(
        groups=1000, bundle=1, duration_s=minutes * 60, free_users=200_000, paid_users=20_000
    )
    return Scenario("flood", scaling, traffic, FLAT_FLOOD, gpus_per_host=1, initial_hosts=hosts, **kw)  # type: ignore[arg-type]


def _iac_with_default(tmp_path: Path, variable: str, was: str, value: str) -> Path:
    """A copy of iac/ whose gpu_pool `variable` defaults to `value` (its default matched `was`)."""
    iac = tmp_path / "iac"
    shutil.copytree(REPO / "iac", iac, ignore=shutil.ignore_patterns(".terraform*", "tests"))
    variables = iac / "modules" / "gpu_pool" / "variables.tf"
    text = variables.read_text()
    block = re.search(rf'variable "{variable}" \{{.*?default\s*=\s*({was})', text, re.S)
    assert block is not None
    variables.write_text(text[: block.start(1)] + value + text[block.end(1) :])
    return iac


def test_terraform_numbers_are_read_from_iac_not_copied(tmp_path: Path) -> None:
    iac = _iac_with_default(tmp_path, "surge_demand", r"[0-9.]+", "2.75")
    assert terraform.read(iac).surge_demand == 2.75
    assert terraform.read().surge_demand != 2.75


def test_a_models_own_scaling_settings_in_the_example_reach_the_simulation(tmp_path: Path) -> None:
    # var.models may set surge_demand and scale_in_drain_s per model (the gpu_pool module gets
    # them); the simulation read only the module's defaults for those two, and simulated a group
    # other than the one deployed.
    iac = tmp_path / "iac"
    shutil.copytree(REPO / "iac", iac, ignore=shutil.ignore_patterns(".terraform*", "tests"))
    variables = iac / "envs" / "example" / "variables.tf"
    text = variables.read_text()
    own = "demand_target      = 0.8\n"
    assert own in text
    variables.write_text(text.replace(own, own + "surge_demand = 2.75\nscale_in_drain_s = 900\n", 1))

    settings = terraform.read(iac)

    assert (settings.surge_demand, settings.scale_in_drain_s) == (2.75, 900)


def test_a_models_own_surge_demand_bounds_its_surge_steps(tmp_path: Path) -> None:
    # The step policy's first step ends at var.surge_demand above the alarm's threshold
    # (gpu_pool/scaling.tf): deployed with a model's own 2.75, the +50 % step covers a breach up to
    # 2.75 and +100 % begins there. The simulation bounded its steps by the module's 1.5 whatever
    # the model's own threshold, so it doubled the group where the deployed one adds half.
    iac = tmp_path / "iac"
    shutil.copytree(REPO / "iac", iac, ignore=shutil.ignore_patterns(".terraform*", "tests"))
    variables = iac / "envs" / "example" / "variables.tf"
    text = variables.read_text()
    own = "demand_target      = 0.8\n"
    variables.write_text(text.replace(own, own + "surge_demand = 2.75\n", 1))

    settings = terraform.read(iac)

    assert settings.surge_steps == ((0.0, 2.75, 50), (2.75, None, 100))


def test_saturated_group_with_empty_edge_queue_does_not_scale_in() -> None:
    env = simpy.Environment()
    curve = step_curve.h200_llama70b()
    # At its budget (max_size 3): the signal reads ~1.0 for as long as the streams run.
    settings = terraform.read().with_overrides(min_size=1, max_size=3)
    recorder = Recorder(bundle=1)
    group = GpuGroup(
        env, lambda: [Replica(curve, 8, 1, "continuous")], curve, 8, 1, 3, 0, 300, HostTiming(), lambda: None
    )
    group.start(3)
    edge = EdgeQueue(env, tiers.read(), group, recorder)
    for host in group.in_service():
        for replica in host.replicas:
            replica.running = replica.slots  # every sequence busy
            edge.in_flight += replica.slots
    assert edge.queued() == 0
    scaler = Autoscaler(env, settings, group, edge, recorder)
    env.process(scaler.run())
    env.run(until=(SCALE_IN_PERIODS + 10) * settings.metric_period_s)
    assert group.desired == 3
    assert [a for a in scaler.actions if a[1] == "target_in"] == []


def test_idle_group_scales_in_after_the_quiet_periods() -> None:
    """The same group with nothing running does scale in: the test above could not pass by accident."""
    env = simpy.Environment()
    curve = step_curve.h200_llama70b()
    settings = terraform.read().with_overrides(min_size=1, max_size=8)
    recorder = Recorder(bundle=1)
    group = GpuGroup(
        env, lambda: [Replica(curve, 8, 1, "continuous")], curve, 8, 1, 8, 0, 300, HostTiming(), lambda: None
    )
    group.start(3)
    scaler = Autoscaler(env, settings, group, EdgeQueue(env, tiers.read(), group, recorder), recorder)
    env.process(scaler.run())
    env.run(until=(SCALE_IN_PERIODS + 10) * settings.metric_period_s)
    assert group.desired == 1


def test_paid_ttft_stays_below_free_under_a_free_flood() -> None:
    out = run(small_flood(hosts=2))
    r = out.recorder
    assert r.rejected_total("free", ("wait",)) > 0  # it is a flood: free traffic is turned away
    assert r.ttft_percentile("paid", 99) < r.ttft_percentile("free", 50)
    assert r.rejected_total("paid", ("wait", "no_replica")) == 0


def test_more_replicas_turn_fewer_requests_away() -> None:
    few = run(small_flood(hosts=1)).recorder
    more = run(small_flood(hosts=3)).recorder
    reasons = ("wait", "no_replica")
    assert more.rejected_total("free", reasons) < few.rejected_total("free", reasons)
    assert more.tokens > few.tokens


def test_continuous_batching_serves_more_than_static_on_the_same_gpus() -> None:
    continuous = run(small_flood(hosts=2, minutes=8)).recorder
    static = run(small_flood(hosts=2, minutes=8, batching="static")).recorder
    assert continuous.tokens > 1.3 * static.tokens


def quiet_group(scaling: terraform.ScalingSettings) -> Scenario:
    """One in-service host of one GPU, a trickle of traffic, three minutes."""
    traffic = TrafficSpec(groups=100_000, bundle=1, duration_s=180, free_users=2_000, paid_users=200)
    return Scenario("quiet", scaling, traffic, FLAT_FLOOD, gpus_per_host=1, initial_hosts=1)


def test_the_simulated_warm_pool_is_the_one_the_iac_deploys() -> None:
    # iac/modules/gpu_pool sets MaxGroupPreparedCapacity to warm_pool_min_size (warm_pool_max_prepared
    # unset): AWS then keeps exactly warm_pool_min_size stopped hosts. The simulation kept AWS's
    # default for an unset capacity, max_size - desired (7 for max_size 8 at one host), and started
    # every scale-out from warm hosts that the deployed group does not have (3 min against a 10 min
    # cold start).
    settings = terraform.read()
    assert settings.warm_pool_min_size < settings.max_size - 1

    minutes = [m for m in run(quiet_group(settings)).recorder.minutes.values() if m.desired_hosts]

    assert minutes
    assert {m.warm_hosts for m in minutes} == {settings.warm_pool_min_size}


def test_warm_pool_max_prepared_minus_one_keeps_max_size_less_desired_warm(tmp_path: Path) -> None:
    settings = terraform.read(_iac_with_default(tmp_path, "warm_pool_max_prepared", "null", "-1"))

    minutes = [m for m in run(quiet_group(settings)).recorder.minutes.values() if m.desired_hosts]

    assert minutes
    assert {m.warm_hosts for m in minutes} == {settings.max_size - 1}
