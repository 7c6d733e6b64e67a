"""What the Terraform must say, read from the HCL (no AWS, no providers needed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from edge.config import load_settings
from edge.messages import dynamodb
from edge.scaling import metric as scaling_metric
from tests.iac.hcl import EXAMPLE, IAC, MODULES, module, only, resolve

ENV = module(EXAMPLE)


def default(mod: str, variable: str) -> Any:
    return module(MODULES / mod).variables()[variable]["default"]


def test_alb_keeps_streams_open_and_serves_https_only() -> None:
    alb = module(MODULES / "alb")
    lb = alb.resource("aws_lb", "this")
    https = alb.resource("aws_lb_listener", "https")
    http = alb.resource("aws_lb_listener", "http_redirect")
    redirect = only(only(http["default_action"])["redirect"])

    assert lb["idle_timeout"] == "${var.idle_timeout_s}"
    assert default("alb", "idle_timeout_s") >= 300
    assert "idle_timeout_s" not in ENV.calls()["alb"]
    assert lb["drop_invalid_header_fields"] is True
    assert only(lb["access_logs"])["enabled"] is True
    assert https["protocol"] == "HTTPS" and https["port"] == 443
    assert "aws_acm_certificate" in https["certificate_arn"]
    assert https["ssl_policy"].startswith("ELBSecurityPolicy-TLS13")
    assert http["port"] == 80
    assert redirect == {"port": "443", "protocol": "HTTPS", "status_code": "HTTP_301"}


def test_target_group_checks_liveness_not_readiness() -> None:
    # /readyz is 503 while no GPU replica is ready: ECS would replace every edge task during GPU
    # bring-up and scale from zero.
    group = module(MODULES / "alb").resource("aws_lb_target_group", "edge")

    assert only(group["health_check"])["path"] == "/healthz"
    assert group["load_balancing_algorithm_type"] == "least_outstanding_requests"


def test_gpu_pool_has_a_warm_pool_instance_refresh_and_imdsv2() -> None:
    gpu = module(MODULES / "gpu_pool")
    group = gpu.resource("aws_autoscaling_group", "gpu")
    template = gpu.resource("aws_launch_template", "gpu")
    warm = only(group["warm_pool"])
    metadata = only(template["metadata_options"])
    ebs = only(only(template["block_device_mappings"])["ebs"])

    assert warm["pool_state"] == "Stopped"
    assert warm["min_size"] == "${var.warm_pool_min_size}" and default("gpu_pool", "warm_pool_min_size") >= 1
    assert only(group["instance_refresh"])["strategy"] == "Rolling"
    assert metadata["http_tokens"] == "required"
    assert metadata["http_put_response_hop_limit"] == 1
    assert ebs["encrypted"] is True and ebs["kms_key_id"] == "${var.kms_key_arn}"
    assert template["image_id"] == "${local.ami_id}"
    assert "resolve:ssm" not in (MODULES / "gpu_pool" / "main.tf").read_text()
    assert "GroupInServiceInstances" in group["enabled_metrics"]


def test_a_surge_alarm_drives_the_step_policy() -> None:
    gpu = module(MODULES / "gpu_pool")
    step = gpu.resource("aws_autoscaling_policy", "demand_surge")
    alarm = gpu.resource("aws_cloudwatch_metric_alarm", "demand_surge")

    assert step["policy_type"] == "StepScaling"
    assert len(step["step_adjustment"]) >= 2
    assert alarm["alarm_actions"] == ["${aws_autoscaling_policy.demand_surge.arn}"]
    assert alarm["threshold"] == "${var.surge_demand}"
    assert default("gpu_pool", "surge_demand") > default("gpu_pool", "demand_target")


def test_demand_with_no_host_wanted_starts_one() -> None:
    gpu = module(MODULES / "gpu_pool")
    step = gpu.resource("aws_autoscaling_policy", "from_zero")
    alarm = gpu.resource("aws_cloudwatch_metric_alarm", "from_zero")
    queries = {q["id"]: q for q in alarm["metric_query"]}

    assert (step["adjustment_type"], only(step["step_adjustment"])["scaling_adjustment"]) == (
        "ExactCapacity",
        1,
    )
    assert alarm["alarm_actions"] == ["${aws_autoscaling_policy.from_zero.arn}"]
    assert only(queries["desired"]["metric"])["metric_name"] == "GroupDesiredCapacity"
    assert queries["unserved_demand"]["expression"] == "IF(desired < 1, demand, 0)"
    assert alarm["comparison_operator"] == "GreaterThanThreshold" and alarm["threshold"] == 0


def test_the_hosts_policy_names_its_group_without_waiting_for_it() -> None:
    iam = (MODULES / "gpu_pool" / "iam.tf").read_text()
    statements = {
        s["sid"]: s for s in module(MODULES / "gpu_pool").data("aws_iam_policy_document")["gpu"]["statement"]
    }

    assert "aws_autoscaling_group.gpu." not in iam
    assert statements["ReportToOwnGroup"]["resources"] == ["${local.group_arn}"]
    assert "autoScalingGroupName/${var.group_name}" in module(MODULES / "gpu_pool").locals()["group_arn"]


def test_user_data_gets_every_value_its_template_uses() -> None:
    gpu = module(MODULES / "gpu_pool")
    user_data = gpu.resource("aws_launch_template", "gpu")["user_data"]
    passed = set(re.findall(r"\b(\w+)\s*=", user_data.split("templatefile(", 1)[1]))
    template = (MODULES / "gpu_pool" / "user_data.sh.tftpl").read_text()
    used = set(re.findall(r"\$\{(\w+)\}", template))

    assert used == passed


def test_redis_is_a_multi_az_encrypted_cluster_with_a_managed_token() -> None:
    redis = module(MODULES / "redis")
    group = redis.resource("aws_elasticache_replication_group", "this")

    assert group["cluster_mode"] == "enabled"
    assert group["parameter_group_name"] == "${aws_elasticache_parameter_group.limiter.name}"
    assert group["transit_encryption_enabled"] is True
    assert group["transit_encryption_mode"] == "required"
    assert group["at_rest_encryption_enabled"] is True
    assert group["kms_key_id"] == "${var.kms_key_arn}"
    assert group["auth_token"] == "${aws_secretsmanager_secret_version.auth_token.secret_string}"
    assert group["multi_az_enabled"] is True and group["automatic_failover_enabled"] is True
    assert default("redis", "replicas_per_shard") >= 1


def test_redis_never_evicts_the_limiters_keys() -> None:
    # Every limiter key has a TTL: volatile-* (the default) or allkeys-* eviction would delete
    # counters under memory pressure and so reset users' limits.
    parameters = module(MODULES / "redis").resource("aws_elasticache_parameter_group", "limiter")
    values = {p["name"]: p["value"] for p in parameters["parameter"]}

    assert parameters["family"] == "redis7"
    assert values == {"cluster-enabled": "yes", "maxmemory-policy": "noeviction"}


def test_engine_bucket_is_private_versioned_encrypted_and_tls_only() -> None:
    bucket = module(MODULES / "engine_bucket")
    block = bucket.resource("aws_s3_bucket_public_access_block", "engines")
    versioning = bucket.resource("aws_s3_bucket_versioning", "engines")
    sse = only(bucket.resource("aws_s3_bucket_server_side_encryption_configuration", "engines")["rule"])
    policy = bucket.data("aws_iam_policy_document")["engines"]
    deny = only(policy["statement"])

    assert {k: block[k] for k in block if k != "bucket"} == {
        "block_public_acls": True,
        "block_public_policy": True,
        "ignore_public_acls": True,
        "restrict_public_buckets": True,
    }
    assert only(versioning["versioning_configuration"])["status"] == "Enabled"
    assert only(sse["apply_server_side_encryption_by_default"])["sse_algorithm"] == "aws:kms"
    assert deny["effect"] == "Deny"
    assert only(deny["condition"]) == {"test": "Bool", "variable": "aws:SecureTransport", "values": ["false"]}


def test_messages_table_matches_the_store() -> None:
    table = module(MODULES / "messages_table").resource("aws_dynamodb_table", "messages")

    assert table["billing_mode"] == "PAY_PER_REQUEST"
    assert table["hash_key"] == dynamodb.PARTITION_KEY
    assert table["range_key"] == dynamodb.SORT_KEY
    assert only(table["ttl"]) == {"attribute_name": dynamodb.TTL_ATTRIBUTE, "enabled": True}
    assert only(table["point_in_time_recovery"])["enabled"] is True
    assert only(table["server_side_encryption"]) == {"enabled": True, "kms_key_arn": "${var.kms_key_arn}"}


def test_edge_may_only_write_and_query_its_messages_table() -> None:
    """And update its conversations' locks (edge/messages/conversation_lock.py), which without
    UpdateItem were never renewed nor given back: every conversation stayed blocked until its lock
    expired. tests/messages/test_task_role_calls.py checks these against the store's own calls."""
    documents = module(MODULES / "edge_service").data("aws_iam_policy_document")
    statements = {s["sid"]: s for s in documents["task"]["statement"]}
    dynamo = [a for s in statements.values() for a in s["actions"] if a.startswith("dynamodb:")]

    assert sorted(dynamo) == [
        "dynamodb:PutItem",
        "dynamodb:Query",
        "dynamodb:UpdateItem",
    ]
    assert statements["MessagesTable"]["actions"] == ["dynamodb:PutItem", "dynamodb:Query"]
    assert statements["MessagesTable"]["resources"] == ["${var.messages_table_arn}"]
    locks = statements["MessagesTableLocks"]
    assert locks["resources"] == ["${var.messages_table_arn}"]
    assert only(locks["condition"]) == {
        "test": "ForAllValues:StringLike",
        "variable": "dynamodb:LeadingKeys",
        "values": [dynamodb.lock_partition("", "").split("/")[0] + "/*"],
    }
    table = resolve(ENV.calls()["edge"]["messages_table_arn"], ENV, "edge")
    assert table == "${aws_dynamodb_table.messages.arn}"


def test_edge_publishes_only_the_scaling_namespace_and_may_discover_replicas() -> None:
    documents = module(MODULES / "edge_service").data("aws_iam_policy_document")
    statements = {s["sid"]: s for s in documents["task"]["statement"]}
    publish, discover = statements["PublishScalingMetric"], statements["DiscoverGpuReplicas"]

    assert publish["actions"] == ["cloudwatch:PutMetricData"]
    assert only(publish["condition"]) == {
        "test": "StringEquals",
        "variable": "cloudwatch:namespace",
        "values": ["${var.metric_namespace}"],
    }
    assert resolve(ENV.calls()["edge"]["metric_namespace"], ENV, "edge") == scaling_metric.NAMESPACE
    assert sorted(discover["actions"]) == ["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"]
    assert not any(a.endswith("*") for s in statements.values() for a in s["actions"])


def test_the_edge_execution_role_pulls_its_image_and_writes_its_logs_only() -> None:
    # AmazonECSTaskExecutionRolePolicy grants ECR pulls and log writes on "*" (every repository and
    # log group of the account): the role's own statements name the edge's repository and log group.
    edge = module(MODULES / "edge_service")
    attached = [a["policy_arn"] for a in edge.resources("aws_iam_role_policy_attachment").values()]
    documents = edge.data("aws_iam_policy_document")
    execution = ("execution_pull_and_log", "execution_secret")
    statements = {s["sid"]: s for doc in execution for s in documents[doc]["statement"]}

    assert attached == []
    assert statements["PullImage"]["resources"] == ["${var.ecr_repository_arn}"]
    assert statements["WriteEdgeLogs"]["resources"] == ["${aws_cloudwatch_log_group.edge.arn}:*"]
    assert [sid for sid, s in statements.items() if "*" in s["resources"]] == ["EcrLogin"]
    assert ENV.calls()["edge"]["ecr_repository_arn"] == "${module.edge_registry.arn}"


def test_gpu_hosts_take_triton_traffic_from_the_edge_only() -> None:
    group = module(MODULES / "gpu_pool").resource("aws_security_group", "gpu")
    ingress = group["ingress"]

    # Triton's HTTP and metrics ports; not its gRPC port 8001, which nothing uses.
    assert sorted((rule["from_port"], rule["to_port"], rule["protocol"]) for rule in ingress) == [
        (8000, 8000, "tcp"),
        (8002, 8002, "tcp"),
    ]
    assert all(rule["security_groups"] == ["${var.edge_security_group_id}"] for rule in ingress)
    assert not any("cidr_blocks" in rule for rule in ingress)
    assert ENV.calls()["gpu_pool"]["edge_security_group_id"] == "${module.edge.security_group_id}"


def test_gpu_hosts_read_only_their_engine_and_pull_only_their_image() -> None:
    gpu = module(MODULES / "gpu_pool")
    statements = {s["sid"]: s for s in gpu.data("aws_iam_policy_document")["gpu"]["statement"]}

    assert statements["ReadEngine"]["actions"] == ["s3:GetObject"]
    # The engine's objects (its prefix, or the bucket for an engine at the root: pool.tftest.hcl).
    assert statements["ReadEngine"]["resources"] == ["${local.engine_objects}"]
    assert gpu.locals()["engine_objects"].count("${var.engine_bucket_arn}/") == 2
    assert statements["PullImage"]["resources"] == ["${var.ecr_repository_arn}"]
    assert all("*" not in a for s in statements.values() for a in s["actions"])


def test_gpu_hosts_get_session_manager_without_the_accounts_parameters() -> None:
    # AmazonSSMManagedInstanceCore grants ssm:GetParameter(s) on every parameter of the account;
    # the hosts read none: Session Manager's own actions are written into their policy instead.
    gpu = module(MODULES / "gpu_pool")
    attached = [a["policy_arn"] for a in gpu.resources("aws_iam_role_policy_attachment").values()]
    statements = {s["sid"]: s for s in gpu.data("aws_iam_policy_document")["gpu"]["statement"]}

    assert attached == []
    assert "ssm:UpdateInstanceInformation" in statements["SessionManagerRegister"]["actions"]
    assert not [a for s in statements.values() for a in s["actions"] if a.startswith("ssm:GetParameter")]


# The example's models as terraform renders them into the template (two models, two tiers).
_RENDER_VALUES = (
    '{models = {"llama-3-8b" = {path = "/opt/floodgate/model/llama-3-8b", '
    'gpu_group = "floodgate-gpu-llama-3-8b", token_weight = 1, max_model_len = 8192, '
    "prefill_s_per_token = 0.00002, "
    'decode_s_per_token = 0.00005}, "llama-3-70b" = {path = "/opt/floodgate/model/llama-3-70b", '
    'gpu_group = "floodgate-gpu-llama-3-70b", token_weight = 4, max_model_len = 32768, '
    "prefill_s_per_token = null, "
    "decode_s_per_token = null}}, "
    'tier_models = {free = ["llama-3-8b"], paid = ["llama-3-70b", "llama-3-8b"]}, '
    'redis_endpoint = "clustercfg.floodgate.cache.amazonaws.com", edge_instances = 2, '
    'messages_table = "floodgate-messages", keys_table = "floodgate-keys", region = "us-east-1", '
    "http_keep_alive_s = 3605, ops_port = 9464, drain_deadline_s = 110, members_per_replica = 75}"
)


def _render_edge_settings(tmp_path: Path) -> str:
    """The template rendered by terraform's own templatefile (its loops included)."""
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("NOT RUN: no terraform on PATH to render the template")
    expression = f'templatefile("{EXAMPLE / "edge.toml.tftpl"}", {_RENDER_VALUES})'
    done = subprocess.run(
        [terraform, "console"], input=expression, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    heredoc = re.search(r"<<EOT\n(.*)\nEOT", done.stdout, re.DOTALL)
    assert heredoc is not None, done.stdout
    return heredoc.group(1)


def test_edge_settings_rendered_by_the_example_load_in_the_edge(tmp_path: Path) -> None:
    template = (EXAMPLE / "edge.toml.tftpl").read_text()
    args = resolve(ENV.calls()["edge"]["config_toml"], ENV, "edge")
    loops = re.findall(r"%\{ for (\w+), (\w+) in (\w+)", template)
    loop_names = {name for loop in loops for name in loop[:2]}
    names = (set(re.findall(r"\$\{(\w+)\}", template)) - loop_names) | {loop[2] for loop in loops}
    settings = load_settings(overrides=tomllib.loads(_render_edge_settings(tmp_path)))

    assert names == set(re.findall(r"\b(\w+)\s*=", args.split("{", 2)[2]))
    assert settings.limiter.backend == "redis"
    assert settings.limiter.redis_url.startswith("rediss://")
    assert settings.limiter.redis_cluster is True
    assert settings.limiter.instance_count == 2
    assert settings.messages.backend == "dynamodb"
    assert settings.server.dev_key is False
    # The edge keeps an idle connection longer than the ALB does, so it never closes one the ALB is
    # about to reuse (the ALB answers such a request 502).
    assert settings.server.http_keep_alive_s > default("alb", "idle_timeout_s")
    assert re.search(r"\bhttp_keep_alive_s\s*=\s*module\.alb\.idle_timeout_s\s*\+\s*\d", args)
    assert module(MODULES / "alb").outputs()["idle_timeout_s"] == "${aws_lb.this.idle_timeout}"
    assert settings.metrics.cloudwatch is True and settings.metrics.cloudwatch_region == "us-east-1"
    # Every model of var.models, each on its own GPU group; the embedded models are gone.
    assert set(settings.models) == {"llama-3-8b", "llama-3-70b"}
    large = settings.models["llama-3-70b"]
    assert large.path == "/opt/floodgate/model/llama-3-70b" and large.token_weight == 4
    assert large.max_model_len == 32768
    assert large.triton == "asg:floodgate-gpu-llama-3-70b:8000:8002"
    assert settings.models["llama-3-8b"].triton == "asg:floodgate-gpu-llama-3-8b:8000:8002"
    # A model's own prices where var.models gives them; the edge's [metrics] ones where not.
    small = settings.models["llama-3-8b"]
    assert (small.prefill_s_per_token, small.decode_s_per_token) == (0.00002, 0.00005)
    assert (large.prefill_s_per_token, large.decode_s_per_token) == (None, None)
    # The edge ends its streams when the load balancer stops waiting for them.
    assert settings.server.drain_deadline_s == 110
    assert re.search(r"\bdrain_deadline_s\s*=\s*var\.deregistration_delay_s\b", args)
    assert ENV.calls()["alb"]["deregistration_delay_s"] == "${var.deregistration_delay_s}"
    # Each replica divided among K edge processes, K the environment's variable.
    assert settings.fleet.members_per_replica == 75
    assert re.search(r"\bmembers_per_replica\s*=\s*var\.members_per_replica\b", args)
    assert settings.tiers["free"].models == ("llama-3-8b",)
    assert settings.tiers["paid"].default_model == "llama-3-70b"
    # The groups named in the settings are the ones the GPU pools create.
    assert re.search(r"\bmodels\s*=\s*local\.edge_models\b", args)
    edge_models = (EXAMPLE / "main.tf").read_text()
    assert re.search(r"gpu_group\s*=\s*local\.gpu_groups\[model\]", edge_models)
    assert re.search(r"group_name\s*=\s*local\.gpu_groups\[each\.key\]", edge_models)


def test_every_checkov_skip_gives_a_reason() -> None:
    skips = [
        line.strip()
        for tf in IAC.rglob("*.tf")
        for line in tf.read_text().splitlines()
        if "checkov:skip" in line
    ]

    assert skips
    for skip in skips:
        assert re.fullmatch(r"#checkov:skip=CKV2?_AWS_\d+:\S.{10,}", skip), skip


def test_stop_timings_match_the_edges_graceful_drain() -> None:
    # ECS stops a task in this order: deregister it and wait the deregistration delay (the ALB
    # closes whatever is still open at its end), then SIGTERM, then SIGKILL after stopTimeout.
    # The edge's own drain ([server] in edge/defaults.toml, read by the running edge) runs from
    # SIGTERM: /readyz 503 for drain_accept_s, streams cut gracefully at drain_deadline_s.
    server = tomllib.loads((IAC.parent / "edge" / "defaults.toml").read_text())["server"]
    stop_timeout = default("edge_service", "stop_timeout_s")
    deregistration = default("alb", "deregistration_delay_s")

    assert stop_timeout <= 120  # Fargate's ceiling
    assert stop_timeout >= server["drain_deadline_s"] + 5  # the edge ends its streams before SIGKILL
    assert deregistration == server["drain_deadline_s"]  # the same drain window either way
    assert deregistration >= server["drain_accept_s"]


# What a task's edge takes to bind its ports on a loaded Fargate vCPU (imports, tokenizers): 1.5 s on
# an idle machine in tests/deploy/test_edge_image_models.py, several times that under load.
EDGE_START_S = 15


def test_a_task_started_while_redis_is_unreachable_is_healthy_within_the_grace_period() -> None:
    # Under `serve --workers` (FLOODGATE_WORKERS) the traffic port /healthz is checked on is listened
    # on only once a worker may take work (edge/server.py). With Redis out of reach from the start
    # that is when its membership falls back to instance_count (edge/membership/membership.py): at
    # the first failed beat begun stale_after_s after the first, a beat being the wait of heartbeat_s
    # plus a call bounded by the client's timeout (heartbeat_s, edge_fleet.py). The load balancer
    # then needs healthy_threshold passing checks, the first up to one interval later. Past the grace
    # period ECS replaces a task still unhealthy: at 60 s a task started during a Redis outage (a
    # scale out, a deployment, which the circuit breaker then rolls back) could be killed before it
    # served.
    fleet = tomllib.loads((IAC.parent / "edge" / "defaults.toml").read_text())["fleet"]
    beat = fleet["heartbeat_s"]
    serves_by = EDGE_START_S + fleet["stale_after_s"] + (beat + beat) + beat
    check = only(module(MODULES / "alb").resource("aws_lb_target_group", "edge")["health_check"])
    healthy_by = serves_by + check["healthy_threshold"] * check["interval"] + check["timeout"]

    service = module(MODULES / "edge_service").resource("aws_ecs_service", "edge")

    assert service["health_check_grace_period_seconds"] >= healthy_by


# The slowest decode a stream may see on a GPU host: a large model at a full batch on a small GPU,
# or a stream paused while the replica's KV cache is full (TensorRT-LLM's max_utilization policy).
SLOW_DECODE_TOKENS_PER_S = 8


def test_a_scaled_in_gpu_host_outlasts_the_longest_reply_a_tier_allows() -> None:
    # The terminate hook's timeout is when a draining host's streams are cut (the host agent
    # completes it earlier, as soon as they end). A stream may be placed on the host until every
    # edge has read the group again (discovery_interval_s), then runs up to its tier's max_tokens.
    edge = tomllib.loads((IAC.parent / "edge" / "defaults.toml").read_text())
    longest_reply = max(tier["max_tokens"] for tier in edge["tiers"].values())
    placed_until = edge["upstream"]["discovery_interval_s"]

    drain = default("gpu_pool", "scale_in_drain_s")

    assert drain >= longest_reply / SLOW_DECODE_TOKENS_PER_S + placed_until
    assert 30 <= drain <= 7200  # AWS's HeartbeatTimeout


def test_the_host_agents_own_drain_is_the_terminate_hooks() -> None:
    # The agent completes the terminate hook at --drain-s; started without it (by hand, or a user
    # data that drops the flag) it must not cut streams the hook would still wait for.
    from gpu_container.triton.host_agent import argument_parser

    args = argument_parser().parse_args(["--group", "g", "--ready-hook", "r", "--drain-hook", "d"])

    assert args.drain_s == default("gpu_pool", "scale_in_drain_s")
