"""A moto server (every AWS API it mocks, in one process) on a loopback port, and clients of it.

tests/scaling, tests/fleet and tests/deploy each start their own (their fixtures' scopes differ, and
a group one area creates must not show up in another's listing); this is the one way they do it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.config import Config
from moto.server import ThreadedMotoServer

from tests.support.ports import free_port

REGION = "us-east-1"


@contextmanager
def running_moto() -> Iterator[str]:
    """The endpoint URL of a moto server that runs until the block ends."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def aws_client(service: str, endpoint: str) -> Any:
    """A boto3 client of `service` on the moto server: test credentials, no retries (legacy mode's
    max_attempts 1 is one retry: a create retried after a slow first answer met its own result,
    AlreadyExists), and a read timeout past moto's first EC2 call on a loaded machine (its
    resource tables load then: 10 s was not enough beside the suite)."""
    client: Any = boto3.client(
        service,  # type: ignore[call-overload]  # any service name, typed per literal in the stubs
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=60),
    )
    return client


@contextmanager
def gpu_group(endpoint: str, name: str, desired: int) -> Iterator[tuple[Any, Any]]:
    """An Auto Scaling group of GPU hosts named `name` on the moto server (its launch template, 0 to
    6 hosts, `desired` of them), deleted at the block's end; its autoscaling and EC2 clients."""
    autoscaling = aws_client("autoscaling", endpoint)
    ec2 = aws_client("ec2", endpoint)
    ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"}
    )
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name, "Version": "$Latest"},
        MinSize=0,
        MaxSize=6,
        DesiredCapacity=desired,
        VPCZoneIdentifier=subnet,
    )
    try:
        yield autoscaling, ec2
    finally:
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        ec2.delete_launch_template(LaunchTemplateName=name)
