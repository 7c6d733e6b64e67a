"""A moto server (Auto Scaling + EC2) on a loopback port, and a GPU group in it for each test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.moto_server import gpu_group as moto_gpu_group
from tests.support.moto_server import running_moto

_groups = itertools.count()


@pytest.fixture(scope="package")
def moto_endpoint() -> Iterator[str]:
    with running_moto() as endpoint:
        yield endpoint


@dataclass
class GpuGroup:
    """An Auto Scaling group in moto, and the clients to change it and read it back."""

    name: str
    autoscaling: Any
    ec2: Any

    def instances(self) -> list[dict[str, Any]]:
        group = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.name])
        instances: list[dict[str, Any]] = group["AutoScalingGroups"][0]["Instances"]
        return instances

    def private_ips(self, instance_ids: list[str]) -> list[str]:
        answer = self.ec2.describe_instances(InstanceIds=instance_ids)
        return sorted(i["PrivateIpAddress"] for r in answer["Reservations"] for i in r["Instances"])

    def in_service_ips(self) -> list[str]:
        ids = [i["InstanceId"] for i in self.instances() if i["LifecycleState"] == "InService"]
        return self.private_ips(ids)

    def set_desired(self, count: int) -> None:
        self.autoscaling.set_desired_capacity(AutoScalingGroupName=self.name, DesiredCapacity=count)


@pytest.fixture
def gpu_group(moto_endpoint: str) -> Iterator[GpuGroup]:
    name = f"floodgate-gpu-{next(_groups)}"
    with moto_gpu_group(moto_endpoint, name, desired=2) as (autoscaling, ec2):
        yield GpuGroup(name, autoscaling, ec2)
