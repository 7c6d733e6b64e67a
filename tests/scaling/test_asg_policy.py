"""The GPU pool's target-tracking policy, taken from the Terraform and created through the Auto Scaling
API (moto), reads the very metrics the publisher sends: same namespace, names and dimensions; and
its expression over what two edges at saturated GPUs send does not scale the group in."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from edge.scaling import DemandSignal, ScalingPublisher, metric
from tests.iac.hcl import EXAMPLE, MODULES, module, only, resolve
from tests.scaling.conftest import PutRecorder, aws_client
from tests.scaling.test_demand import Edge, replicas

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"


def from_hcl(value: Any) -> Any:
    """A value of the gpu_pool module as the example environment instantiates it for MODEL."""
    if value == "${var.model}":
        return MODEL
    resolved = resolve(value, module(EXAMPLE), "gpu_pool")
    if isinstance(resolved, str) and "${local.demand_expression}" == resolved:
        return from_hcl(module(MODULES / "gpu_pool").locals()["demand_expression"])
    if isinstance(resolved, str):
        return re.sub(r"\$\{(var\.\w+)\}", lambda m: str(from_hcl("${" + m.group(1) + "}")), resolved)
    return resolved


def target_tracking_from_hcl() -> dict[str, Any]:
    policy = module(MODULES / "gpu_pool").resource("aws_autoscaling_policy", "demand_target")
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
    target = module(EXAMPLE).variables()["models"]["default"][MODEL]["demand_target"]
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


def evaluate(expression: str, values: dict[str, float]) -> float:
    """A CloudWatch metric-math expression of the policy's shape, `MAX([a / n, b])`, on numbers."""
    python = expression.replace("MAX(", "max(")
    assert set(re.findall(r"[A-Za-z_]+", python)) <= {"max", *values}, expression
    result: float = eval(python, {"__builtins__": {}, "max": max}, values)
    return result


async def test_the_terraform_policy_does_not_scale_in_saturated_gpus(
    moto_endpoint: str, recorder: PutRecorder
) -> None:
    autoscaling = aws_client("autoscaling", moto_endpoint)
    cloudwatch = aws_client("cloudwatch", moto_endpoint)
    group = create_group(moto_endpoint)
    autoscaling.put_scaling_policy(
        AutoScalingGroupName=group,
        PolicyName="demand",
        PolicyType="TargetTrackingScaling",
        TargetTrackingConfiguration=target_tracking_from_hcl(),
    )
    (policy,) = autoscaling.describe_policies(AutoScalingGroupName=group)["ScalingPolicies"]
    tracking = policy["TargetTrackingConfiguration"]
    by_id = {m["Id"]: m for m in tracking["CustomizedMetricSpecification"]["Metrics"]}

    # docs/deploy.md's worked example: two edges, 4 saturated replicas, both edge queues empty.
    for _ in range(2):
        edge = Edge(replicas(4, running=64, waiting=86, held_each=75))
        publisher = ScalingPublisher(
            DemandSignal(edge).sample, dimensions=metric.dimensions(MODEL), client_factory=recorder.client
        )
        for _ in range(metric.SAMPLES_PER_PERIOD):
            publisher.sample()
        assert await publisher.flush()

    now = datetime.now(UTC)
    queries = [
        {"Id": name, "MetricStat": {**by_id[name]["MetricStat"], "Period": 3600}}
        for name in ("demand", "replica_load")
    ]
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=queries, StartTime=now - timedelta(minutes=30), EndTime=now + timedelta(minutes=30)
    )
    values = {r["Id"]: float(only_value(r["Values"])) for r in answer["MetricDataResults"]}
    tracked = by_id["demand_per_replica"]

    assert tracked["ReturnData"] is True
    assert by_id["demand"]["MetricStat"]["Stat"] == "Sum"
    assert by_id["replica_load"]["MetricStat"]["Stat"] == "Maximum"
    value = evaluate(tracked["Expression"], values)
    assert value == pytest.approx(600 / 256)
    # Target tracking's new size: current x value / target, rounded up. Never below the current 4.
    assert tracking["TargetValue"] == pytest.approx(0.8)
    assert -(-4 * value // tracking["TargetValue"]) > 4


def only_value(values: list[float]) -> float:
    assert len(values) == 1, values
    return values[0]
