"""The scaling signal is defined once, in edge/scaling/metric.py: the Terraform that scales on it must
use the same namespace, names, dimension, statistics and sampling, through the example's wiring."""

from __future__ import annotations

from typing import Any

from edge.scaling import metric
from tests.iac.hcl import EXAMPLE, MODULES, module, only, resolve

ENV = module(EXAMPLE)
GPU = module(MODULES / "gpu_pool")
MONITORING = module(MODULES / "monitoring")
EXPRESSION = f"MAX([demand / {metric.SAMPLES_PER_PERIOD}, replica_load])"


def in_env(value: Any, call: str) -> Any:
    return resolve(value, ENV, call)


def test_the_constants_module_matches_python() -> None:
    outputs = module(MODULES / "scaling_metric").outputs()

    assert outputs == {
        "namespace": metric.NAMESPACE,
        "demand_metric": metric.DEMAND_METRIC,
        "replica_load_metric": metric.REPLICA_LOAD_METRIC,
        "model_dimension": metric.MODEL_DIMENSION,
        "period_s": metric.PERIOD_S,
        "samples_per_period": metric.SAMPLES_PER_PERIOD,
    }


def test_target_tracking_uses_the_published_metrics() -> None:
    policy = GPU.resource("aws_autoscaling_policy", "demand_target")
    spec = only(only(policy["target_tracking_configuration"])["customized_metric_specification"])
    by_id = {m["id"]: m for m in spec["metrics"]}

    assert policy["policy_type"] == "TargetTrackingScaling"
    for query, name, stat in (
        ("demand", metric.DEMAND_METRIC, "Sum"),
        ("replica_load", metric.REPLICA_LOAD_METRIC, "Maximum"),
    ):
        metric_stat = only(by_id[query]["metric_stat"])
        published = only(metric_stat["metric"])
        dimension = only(published["dimensions"])
        assert in_env(published["namespace"], "gpu_pool") == metric.NAMESPACE
        assert in_env(published["metric_name"], "gpu_pool") == name
        assert in_env(dimension["name"], "gpu_pool") == metric.MODEL_DIMENSION
        assert dimension["value"] == "${var.model}"
        assert metric_stat["stat"] == stat
    assert by_id["demand_per_replica"]["return_data"] is True
    assert by_id["demand_per_replica"]["expression"] == "${local.demand_expression}"
    expression = GPU.locals()["demand_expression"]
    assert expression == "MAX([demand / ${var.metric_samples_per_period}, replica_load])"
    assert in_env("${var.metric_samples_per_period}", "gpu_pool") == metric.SAMPLES_PER_PERIOD


def test_the_surge_alarm_and_the_demand_alarm_read_the_same_metrics() -> None:
    surge = GPU.resource("aws_cloudwatch_metric_alarm", "demand_surge")
    high = MONITORING.resource("aws_cloudwatch_metric_alarm", "demand_high")

    for alarm, call in ((surge, "gpu_pool"), (high, "monitoring")):
        queries = {q["id"]: q for q in alarm["metric_query"]}
        for query, name, stat in (
            ("demand", metric.DEMAND_METRIC, "Sum"),
            ("replica_load", metric.REPLICA_LOAD_METRIC, "Maximum"),
        ):
            published = only(queries[query]["metric"])
            assert in_env(published["namespace"], call) == metric.NAMESPACE
            assert in_env(published["metric_name"], call) == name
            assert in_env(published["period"], call) == metric.PERIOD_S
            assert published["stat"] == stat
            (dimension_key,) = published["dimensions"]  # `(var.x) = ...`: a key computed from a variable
            dimension = dimension_key.replace("${(", "${").replace(")}", "}")
            assert in_env(dimension, call) == metric.MODEL_DIMENSION
        expression = queries["demand_per_replica"]["expression"]
        samples = "${var.metric_samples_per_period}"
        assert expression in (
            "${local.demand_expression}",
            EXPRESSION.replace(str(metric.SAMPLES_PER_PERIOD), samples),
        )


def test_the_edge_may_publish_to_that_namespace_only() -> None:
    documents = module(MODULES / "edge_service").data("aws_iam_policy_document")
    statement = next(s for s in documents["task"]["statement"] if s["sid"] == "PublishScalingMetric")
    condition = only(statement["condition"])

    assert statement["actions"] == ["cloudwatch:PutMetricData"]
    assert condition["variable"] == "cloudwatch:namespace"
    assert [in_env(v, "edge") for v in condition["values"]] == [metric.NAMESPACE]
