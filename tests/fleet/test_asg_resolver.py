"""The Auto Scaling group resolver against moto's Auto Scaling and EC2 APIs (server mode, loopback)."""

from __future__ import annotations

import pytest

from edge.upstreams.asg_resolver import AsgResolveError, AsgResolver, AsgSpec, is_asg_spec, parse_asg_spec
from tests.fleet.conftest import GpuGroup


def _resolver(group: GpuGroup, http_port: int = 8000, metrics_port: int = 8002) -> AsgResolver:
    return AsgResolver(AsgSpec(group.name, http_port, metrics_port), group.autoscaling, group.ec2)


def test_spec_names_the_group_and_optional_ports() -> None:
    assert parse_asg_spec("asg:gpu") == AsgSpec("gpu", 8000, 8002)
    assert parse_asg_spec(" asg:gpu:9001 ") == AsgSpec("gpu", 9001, 8002)
    assert parse_asg_spec("asg:gpu:9001:9002") == AsgSpec("gpu", 9001, 9002)
    assert is_asg_spec("asg:gpu") and not is_asg_spec("10.0.0.1:8000")
    for bad in ("asg:", "asg:gpu:x", "asg:gpu:1:2:3", "gpu:8000"):
        with pytest.raises(ValueError):
            parse_asg_spec(bad)


def test_finds_the_private_ips_of_the_groups_instances(gpu_group: GpuGroup) -> None:
    specs = _resolver(gpu_group, 9001, 9002).replica_specs()

    expected = gpu_group.in_service_ips()
    assert len(expected) == 2
    assert specs == [f"{ip}:9001:9002" for ip in expected]


def test_follows_the_desired_capacity(gpu_group: GpuGroup) -> None:
    resolver = _resolver(gpu_group)
    before = set(resolver.private_ips())

    gpu_group.set_desired(4)
    grown = set(resolver.private_ips())
    gpu_group.set_desired(1)
    shrunk = set(resolver.private_ips())

    assert len(before) == 2 and before < grown and len(grown) == 4
    assert len(shrunk) == 1 and shrunk < grown
    assert sorted(shrunk) == gpu_group.in_service_ips()


def test_standby_and_unhealthy_instances_are_not_replicas(gpu_group: GpuGroup) -> None:
    first, second = (i["InstanceId"] for i in gpu_group.instances())
    gpu_group.autoscaling.enter_standby(
        AutoScalingGroupName=gpu_group.name, InstanceIds=[first], ShouldDecrementDesiredCapacity=True
    )
    gpu_group.autoscaling.set_instance_health(InstanceId=second, HealthStatus="Unhealthy")

    ids = _resolver(gpu_group).instance_ids()

    assert first not in ids and second not in ids
    states = {i["InstanceId"]: (i["LifecycleState"], i["HealthStatus"]) for i in gpu_group.instances()}
    assert ids == sorted(i for i, state in states.items() if state == ("InService", "Healthy"))


def test_an_unknown_group_is_an_error_not_an_empty_fleet(gpu_group: GpuGroup) -> None:
    resolver = AsgResolver(AsgSpec("no-such-group"), gpu_group.autoscaling, gpu_group.ec2)
    with pytest.raises(AsgResolveError, match="no-such-group"):
        resolver.replica_specs()
