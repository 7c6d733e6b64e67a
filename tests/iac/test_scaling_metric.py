"""The scaling metric is defined once, in edge/scaling_metric.py: the Terraform that scales on it
must use the same namespace, name, dimension and sampling, through the example's wiring."""

from __future__ import annotations

from typing import Any

from edge import scaling_metric
from tests.iac.hcl import EXAMPLE, MODULES, module, only, resolve

ENV = module(EXAMPLE)
GPU = module(MODULES / "gpu_pool")
MONITORING = module(MODULES / "monitoring")


def in_env(value: Any, call: str) -> Any:
    return resolve(value, ENV, call)


def test_the_constants_module_matches_python() -> None:
    outputs = module(MODULES / "scaling_metric").outputs()

    assert outputs == {
        "namespace": scaling_metric.NAMESPACE,
        "metric_name": scaling_metric.METRIC_NAME,
        "model_dimension": scaling_metric.MODEL_DIMENSION,
        "period_s": scaling_metric.PERIOD_S,
        "samples_per_period": scaling_metric.SAMPLES_PER_PERIOD,
    }


def test_target_tracking_uses_the_published_metric() -> None:
    policy = GPU.resource("aws_autoscaling_policy", "queue_depth_target")
    spec = only(only(policy["target_tracking_configuration"])["customized_metric_specification"])
    by_id = {m["id"]: m for m in spec["metrics"]}
    stat = only(by_id["queued"]["metric_stat"])
    metric = only(stat["metric"])
    dimension = only(metric["dimensions"])

    assert policy["policy_type"] == "TargetTrackingScaling"
    assert in_env(metric["namespace"], "gpu_pool") == scaling_metric.NAMESPACE
    assert in_env(metric["metric_name"], "gpu_pool") == scaling_metric.METRIC_NAME
    assert in_env(dimension["name"], "gpu_pool") == scaling_metric.MODEL_DIMENSION
    assert dimension["value"] == "${var.model}"
    assert stat["stat"] == "Sum"
    assert by_id["backlog_per_replica"]["return_data"] is True
    assert by_id["backlog_per_replica"]["expression"] == "${local.backlog_expression}"
    expression = GPU.locals()["backlog_expression"]
    assert expression == "queued / ${var.metric_samples_per_period}"
    assert in_env("${var.metric_samples_per_period}", "gpu_pool") == scaling_metric.SAMPLES_PER_PERIOD


def test_the_surge_alarm_and_the_queue_alarm_read_the_same_metric() -> None:
    surge = GPU.resource("aws_cloudwatch_metric_alarm", "queue_depth_surge")
    high = MONITORING.resource("aws_cloudwatch_metric_alarm", "queue_depth_high")

    for alarm, call in ((surge, "gpu_pool"), (high, "monitoring")):
        queries = {q["id"]: q for q in alarm["metric_query"]}
        metric = only(queries["queued"]["metric"])
        assert in_env(metric["namespace"], call) == scaling_metric.NAMESPACE
        assert in_env(metric["metric_name"], call) == scaling_metric.METRIC_NAME
        assert in_env(metric["period"], call) == scaling_metric.PERIOD_S
        assert metric["stat"] == "Sum"
        (dimension_key,) = metric["dimensions"]  # `(var.x) = ...`: a key computed from a variable
        dimension = dimension_key.replace("${(", "${").replace(")}", "}")
        assert in_env(dimension, call) == scaling_metric.MODEL_DIMENSION


def test_the_edge_may_publish_to_that_namespace_only() -> None:
    documents = module(MODULES / "edge_service").data("aws_iam_policy_document")
    statement = next(s for s in documents["task"]["statement"] if s["sid"] == "PublishScalingMetric")
    condition = only(statement["condition"])

    assert statement["actions"] == ["cloudwatch:PutMetricData"]
    assert condition["variable"] == "cloudwatch:namespace"
    assert [in_env(v, "edge") for v in condition["values"]] == [scaling_metric.NAMESPACE]
