"""The GPU pool's target-tracking policy, taken from the Terraform and created through the Auto Scaling
API (moto), reads the very metric the publisher sends: same namespace, name and dimensions."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from edge import scaling_metric
from edge.cloudwatch import QueueDepthPublisher
from tests.iac.hcl import EXAMPLE, MODULES, module, only, resolve
from tests.scaling.conftest import PutRecorder, aws_client

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"


def from_hcl(value: Any) -> Any:
    """A value of the gpu_pool module as the example environment instantiates it for MODEL."""
    if value == "${var.model}":
        return MODEL
    resolved = resolve(value, module(EXAMPLE), "gpu_pool")
    if isinstance(resolved, str) and "${local.backlog_expression}" == resolved:
        return from_hcl(module(MODULES / "gpu_pool").locals()["backlog_expression"])
    if isinstance(resolved, str):
        return re.sub(r"\$\{(var\.\w+)\}", lambda m: str(from_hcl("${" + m.group(1) + "}")), resolved)
    return resolved


def target_tracking_from_hcl() -> dict[str, Any]:
    policy = module(MODULES / "gpu_pool").resource("aws_autoscaling_policy", "queue_depth_target")
    config = only(policy["target_tracking_configuration"])
    queries = []
    for m in only(config["customized_metric_specification"])["metrics"]:
        query: dict[str, Any] = {"Id": m["id"], "ReturnData": m["return_data"]}
        if "expression" in m:
            query["Expression"] = from_hcl(m["expression"])
        else:
            stat = only(m["metric_stat"])
            metric = only(stat["metric"])
            query["MetricStat"] = {
                "Metric": {
                    "Namespace": from_hcl(metric["namespace"]),
                    "MetricName": from_hcl(metric["metric_name"]),
                    "Dimensions": [
                        {"Name": from_hcl(d["name"]), "Value": from_hcl(d["value"])}
                        for d in metric["dimensions"]
                    ],
                },
                "Stat": stat["stat"],
            }
        queries.append(query)
    target = module(EXAMPLE).variables()["models"]["default"][MODEL]["queue_depth_target"]
    return {"TargetValue": float(target), "CustomizedMetricSpecification": {"Metrics": queries}}


def create_group(endpoint: str) -> str:
    ec2 = aws_client("ec2", endpoint)
    autoscaling = aws_client("autoscaling", endpoint)
    template = ec2.create_launch_template(
        LaunchTemplateName="gpu-llama",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g6e.xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="floodgate-gpu-llama-3-8b",
        LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        MinSize=0,
        MaxSize=4,
        AvailabilityZones=["us-east-1a"],
    )
    return "floodgate-gpu-llama-3-8b"


async def test_the_terraform_policy_tracks_what_the_publisher_sends(
    moto_endpoint: str, recorder: PutRecorder
) -> None:
    autoscaling = aws_client("autoscaling", moto_endpoint)
    cloudwatch = aws_client("cloudwatch", moto_endpoint)
    group = create_group(moto_endpoint)
    autoscaling.put_scaling_policy(
        AutoScalingGroupName=group,
        PolicyName="queue-depth",
        PolicyType="TargetTrackingScaling",
        TargetTrackingConfiguration=target_tracking_from_hcl(),
    )
    (policy,) = autoscaling.describe_policies(AutoScalingGroupName=group)["ScalingPolicies"]
    metrics = policy["TargetTrackingConfiguration"]["CustomizedMetricSpecification"]["Metrics"]
    by_id = {m["Id"]: m for m in metrics}
    tracked = by_id["queued"]["MetricStat"]

    # Two edge instances, one period's samples each: 2 and 6 requests waiting per replica.
    for per_replica in (2.0, 6.0):
        publisher = QueueDepthPublisher(
            lambda v=per_replica: v,
            dimensions=scaling_metric.dimensions(MODEL),
            client_factory=recorder.client,
        )
        for _ in range(scaling_metric.SAMPLES_PER_PERIOD):
            publisher.sample()
        assert await publisher.flush()

    now = datetime.now(UTC)
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=[{"Id": "queued", "MetricStat": {**tracked, "Period": 3600}}],
        StartTime=now - timedelta(minutes=30),
        EndTime=now + timedelta(minutes=30),
    )
    (queued,) = answer["MetricDataResults"][0]["Values"]
    numerator, divisor = by_id["backlog_per_replica"]["Expression"].split(" / ")

    assert by_id["backlog_per_replica"]["ReturnData"] is True
    assert numerator == "queued"
    # The fleet's backlog per replica is the sum of the edges' views: 2 + 6.
    assert queued / float(divisor) == pytest.approx(8.0)
