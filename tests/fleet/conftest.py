"""A moto server (Auto Scaling + EC2) on a loopback port, and a GPU group in it for each test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.moto_server import aws_client, running_moto

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
    autoscaling = aws_client("autoscaling", moto_endpoint)
    ec2 = aws_client("ec2", moto_endpoint)
    name = f"floodgate-gpu-{next(_groups)}"
    ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"}
    )
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name, "Version": "$Latest"},
        MinSize=0,
        MaxSize=6,
        DesiredCapacity=2,
        VPCZoneIdentifier=subnet,
    )
    try:
        yield GpuGroup(name, autoscaling, ec2)
    finally:
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        ec2.delete_launch_template(LaunchTemplateName=name)
