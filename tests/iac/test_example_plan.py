"""The example environment as `terraform test` plans it (iac/envs/example/tests, mocked AWS provider,
no account): what that plan would deploy, checked against the real consumers. The edge settings it
renders go through the task's start script (scripts/edge-start.sh) and the edge's own loader, as a
task starts; the names it gives AWS resources are matched against the AWS APIs' own patterns
(botocore's service models)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import botocore.session
import msgspec
import pytest

from edge.admission.replica_set import ReplicaState
from edge.app import _max_model_len
from edge.cli import build_parser
from edge.config import DEFAULTS_PATH, Settings, load_settings
from edge.models.served import served_models
from edge.scaling import DemandSignal, WorkPrice, metric, work_price
from edge.server import bind_listeners
from edge.workers import worker_overrides
from tests.iac.hcl import MODULES, module
from tests.iac.terraform_env import REPO, init, planned, planned_runs, require_mirror
from tests.support.boto3_region import region_boto3_resolves
from tests.support.live_server import demo_model_dir

# iac/envs/example/tests/settings.tftest.hcl: two models named with a dot, as Llama 3.1 and Qwen2.5 are.
DOTTED = ("llama-3.1-8b", "qwen2.5-72b")


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    binary = require_mirror()
    work = tmp_path_factory.mktemp("example-plan")
    shutil.copytree(REPO / "iac", work / "iac")
    example = work / "iac" / "envs" / "example"
    env = init(binary, example, work)
    return planned_runs(binary, example, env, "tests/settings.tftest.hcl", "tests/knobs.tftest.hcl")


class Asked:
    """A dispatcher asked 3 requests of 1000 prompt tokens since the previous sample, no replica."""

    def __init__(self) -> None:
        self.calls = 0

    def replica_states(self) -> list[ReplicaState]:
        return []

    def offered(self) -> tuple[int, int]:
        self.calls += 1
        return (0, 0) if self.calls == 1 else (3, 3000)


def task_start(plan: dict[str, Any], run_dir: Path) -> list[str]:
    """The `floodgate` command line an edge task of this plan runs: its start script, given the
    task definition's environment (the Redis token spliced in), writes the settings and execs it."""
    task = planned(plan, "module.edge.aws_ecs_task_definition.edge")
    (container,) = json.loads(task["container_definitions"])
    environment = {e["name"]: e["value"] for e in container["environment"]}
    bin_dir = run_dir / "bin"
    bin_dir.mkdir()
    (bin_dir / "floodgate").write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    (bin_dir / "floodgate").chmod(0o755)
    started = subprocess.run(
        ["sh", str(REPO / "scripts" / "edge-start.sh")],
        env={
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            **{k: v for k, v in environment.items() if k.startswith("FLOODGATE_")},
            "FLOODGATE_RUN_DIR": str(run_dir),
            "REDIS_AUTH_TOKEN": "tok3n",
            "FLOODGATE_KEYS_JSONL": "",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode == 0, started.stderr
    return started.stdout.splitlines()


def edge_settings(plan: dict[str, Any], run_dir: Path) -> Settings:
    """The settings an edge task of this plan starts with: those `floodgate serve` loads."""
    args = build_parser().parse_args(task_start(plan, run_dir))
    assert args.config == f"{run_dir}/config.toml"
    return load_settings(args.config)


def api_pattern(service: str, shape: str, member: str) -> tuple[str, int]:
    """A name's pattern and longest length in an AWS API (botocore's service model)."""
    model = botocore.session.get_session().get_service_model(service)
    metadata = model.shape_for(shape).members[member].metadata
    return metadata["pattern"], metadata["max"]


def test_dotted_model_names_load_in_the_edge_under_their_own_names(
    plans: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    plan = plans["dotted_model_names"]

    settings = edge_settings(plan, tmp_path)

    assert set(settings.models) == set(DOTTED)
    for model in DOTTED:
        group = planned(plan, f'module.gpu_pool["{model}"].aws_autoscaling_group.gpu')["name"]
        # The edge finds the model's replicas in the group this plan creates for it.
        assert settings.models[model].triton == f"asg:{group}:8000:8002"
    assert settings.models["qwen2.5-72b"].token_weight == 4
    assert settings.models["llama-3.1-8b"].path == "/opt/floodgate/model/llama-3.1-8b"
    # Every tier the edge defines, each with the models the plan gives it.
    edge_tiers = tomllib.loads(DEFAULTS_PATH.read_text())["tiers"]
    assert {t: settings.tiers[t].models for t in edge_tiers} == {
        "free": ("llama-3.1-8b",),
        "paid": ("qwen2.5-72b", "llama-3.1-8b"),
    }
    assert settings.tiers["paid"].default_model == "qwen2.5-72b"


def test_a_models_own_gpu_prices_set_its_published_demand(
    plans: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    # settings.tftest.hcl prices the 8B model's replicas (var.models); the 72B keeps the edge's
    # [metrics] defaults. Each model's publisher prices its demand with its own settings' metrics.
    settings = edge_settings(plans["dotted_model_names"], tmp_path)
    defaults = WorkPrice()
    prices = {
        "llama-3.1-8b": (2e-5, 5e-5),
        "qwen2.5-72b": (defaults.prefill_s_per_token, defaults.decode_s_per_token),
    }

    for model in served_models(settings):
        signal = DemandSignal(Asked(), work_price(model.settings.metrics))
        prefill, decode = prices[model.name]
        assert signal.sample()[metric.DEMAND_METRIC] == pytest.approx(
            3 * (1000 * prefill + 500 * decode) / 10
        )


def test_each_models_context_is_its_engine_build_not_the_cpu_engines(
    plans: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """A model on Triton replicas holds what its TensorRT-LLM engine was built for (var.models'
    max_model_len, default build_engine.py's --max-seq-len 8192), not the edge's own CPU engine's
    [engine] max_model_len (2,048), which cut every production request past it with a 400."""
    (tmp_path / "run").mkdir()
    settings = edge_settings(plans["dotted_model_names"], tmp_path / "run")
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(demo_model_dir(), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 131072}))

    contexts = {m.name: _max_model_len(m.settings, checkpoint) for m in served_models(settings)}

    assert settings.engine.max_model_len == 2048
    assert contexts == {"llama-3.1-8b": 8192, "qwen2.5-72b": 32768}


def test_every_vcpu_of_an_edge_task_runs_a_worker_whose_operator_port_is_open(
    plans: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """One edge process is one event loop on one core (edge/workers.py): a task of 2 vCPUs ran one,
    the other vCPU idled, and the service's CPU target tracking (50 % of the task) was reached only
    once that loop was saturated. The task runs `floodgate serve --workers` with one worker per
    vCPU, and each worker's operator listener (ops_port + i, as the edge gives it) is declared in
    the task and admitted from the scrapers' group only, never from the load balancer's."""
    plan = plans["a_metrics_scraper"]
    task = planned(plan, "module.edge.aws_ecs_task_definition.edge")
    (container,) = json.loads(task["container_definitions"])
    args = build_parser().parse_args(task_start(plan, tmp_path))
    settings = load_settings(args.config)

    assert args.workers == int(task["cpu"]) // 1024 > 1
    ops_ports = [
        worker_overrides(settings, args.workers, i)["server"]["ops_port"] for i in range(args.workers)
    ]
    assert set(ops_ports) <= {m["containerPort"] for m in container["portMappings"]}
    assert settings.server.port not in ops_ports
    ingress = planned(plan, "module.edge.aws_security_group.edge")["ingress"]
    for port in ops_ports:
        admitting = [r for r in ingress if r["from_port"] <= port <= r["to_port"]]
        assert [(r["security_groups"], r["cidr_blocks"] or []) for r in admitting] == [
            (["sg-0prometheus"], [])
        ]


def test_the_edge_task_gives_boto3_its_region(plans: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """The edge's DynamoDB clients (keys, messages) name no region: boto3 must find it in the task's
    environment, where it reads AWS_DEFAULT_REGION and never AWS_REGION (the GPU hosts' containers
    had died of NoRegionError before). Resolved by boto3 itself, in the task's environment alone."""
    task = planned(plans["dotted_model_names"], "module.edge.aws_ecs_task_definition.edge")
    (container,) = json.loads(task["container_definitions"])
    environment = {e["name"]: e["value"] for e in container["environment"]}
    aws = {k: v for k, v in environment.items() if k.startswith("AWS_")}
    assert region_boto3_resolves(aws, tmp_path) == environment["AWS_REGION"] != ""


def test_the_deployed_images_are_never_expired_by_the_registries(plans: dict[str, dict[str, Any]]) -> None:
    """Each registry keeps its 30 most recent images; the deployed tag (edge_image_tag,
    triton_image_tag: "1" in this plan) has a rule of its own ahead of that count, which ECR never
    lets a later rule expire: a task or GPU host launched after 30 newer pushes still pulls it."""
    for registry in ("edge_registry", "triton_registry"):
        policy = json.loads(
            planned(plans["dotted_model_names"], f"module.{registry}.aws_ecr_lifecycle_policy.this")["policy"]
        )
        rules = sorted(policy["rules"], key=lambda rule: rule["rulePriority"])
        kept = [rule["selection"] for rule in rules if rule["selection"].get("tagPatternList") == ["1"]]
        assert kept == [
            {
                "tagStatus": "tagged",
                "tagPatternList": ["1"],
                "countType": "imageCountMoreThan",
                "countNumber": 1,
            }
        ]
        assert rules[0]["selection"] == kept[0], registry
        assert rules[-1]["selection"]["tagStatus"] == "any", registry


def test_dotted_model_names_give_names_aws_accepts(plans: dict[str, dict[str, Any]]) -> None:
    plan = plans["dotted_model_names"]
    hook_pattern, hook_max = api_pattern("autoscaling", "LifecycleHookSpecification", "LifecycleHookName")
    role_pattern, role_max = api_pattern("iam", "CreateRoleRequest", "RoleName")
    log_pattern, log_max = api_pattern("logs", "CreateLogGroupRequest", "logGroupName")

    for model in DOTTED:
        pool = f'module.gpu_pool["{model}"]'
        group = planned(plan, f"{pool}.aws_autoscaling_group.gpu")
        hooks = [h["name"] for h in group["initial_lifecycle_hook"]]
        hooks.append(planned(plan, f"{pool}.aws_autoscaling_lifecycle_hook.drain")["name"])
        role = planned(plan, f"{pool}.aws_iam_role.gpu")["name"]
        log_group = planned(plan, f"{pool}.aws_cloudwatch_log_group.triton")["name"]
        for name, pattern, longest in (
            *((hook, hook_pattern, hook_max) for hook in hooks),
            (role, role_pattern, role_max),
            (log_group, log_pattern, log_max),
        ):
            assert re.fullmatch(pattern, name) and len(name) <= longest, (name, pattern)
        # Clients, the scaling metric and the hosts' tag keep the model's own name.
        assert {"key": "Model", "value": model, "propagate_at_launch": True} in group["tag"]
        dimension = planned(plan, f"{pool}.aws_cloudwatch_metric_alarm.demand_surge")["metric_query"]
        assert {model} == {
            value for query in dimension for m in query["metric"] for value in m["dimensions"].values()
        }


def test_operators_reach_the_ops_listener_from_the_scrapers_group_only(
    plans: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    plan = plans["a_metrics_scraper"]

    settings = edge_settings(plan, tmp_path)
    ingress = planned(plan, "module.edge.aws_security_group.edge")["ingress"]
    task = planned(plan, "module.edge.aws_ecs_task_definition.edge")
    (container,) = json.loads(task["container_definitions"])

    ops_port = settings.server.ops_port
    # The edge listens for operators on every interface of the task, on the port the task declares
    # and its security group opens to the scraper's group alone (no address range).
    assert settings.server.ops_host == "0.0.0.0"
    assert {"containerPort": ops_port, "protocol": "tcp"} in container["portMappings"]
    # (every worker's port beside it: the worker test above)
    (rule,) = [r for r in ingress if r["from_port"] == ops_port]
    assert rule["security_groups"] == ["sg-0prometheus"]
    assert not rule["cidr_blocks"]
    # Nothing else opens: the public port to the load balancer only.
    assert [r["from_port"] for r in ingress] == sorted([settings.server.port, ops_port])
    # And the edge binds that listener where a packet from another host arrives (not loopback).
    listeners = bind_listeners(msgspec.structs.replace(settings.server, port=0, ops_port=0))
    try:
        assert listeners.ops.getsockname()[0] == "0.0.0.0"
    finally:
        listeners.close()


def test_without_a_scraper_the_ops_port_stays_closed(plans: dict[str, dict[str, Any]]) -> None:
    ingress = planned(plans["dotted_model_names"], "module.edge.aws_security_group.edge")["ingress"]

    assert [(r["from_port"], r["to_port"]) for r in ingress] == [(8000, 8000)]


def test_gpu_root_volumes_are_sized_per_model_and_provisioned_to_read_the_engine(
    plans: dict[str, dict[str, Any]],
) -> None:
    plan = plans["dotted_model_names"]
    sizes = {"llama-3.1-8b": 200, "qwen2.5-72b": 400}  # the default, and the model's root_volume_gb

    for model, size in sizes.items():
        template = planned(plan, f'module.gpu_pool["{model}"].aws_launch_template.gpu')
        (mapping,) = template["block_device_mappings"]
        (ebs,) = mapping["ebs"]
        assert (ebs["volume_type"], ebs["volume_size"]) == ("gp3", size)
        # A warm host re-reads its whole engine from this volume: a 70 GB engine takes 9 minutes at
        # gp3's baseline 125 MiB/s, about 70 s at 1000 MiB/s, which needs 4000 IOPS (0.25 MiB/s each).
        assert (ebs["throughput"], ebs["iops"]) == (1000, 6000)
        assert ebs["throughput"] <= ebs["iops"] / 4 and ebs["iops"] <= 500 * size


def documented_knobs(plan: dict[str, Any], run_dir: Path, model: str) -> dict[str, Any]:
    """Where each knob docs/deploy.md names lands in this plan: on the resource it configures."""
    pool = f'module.gpu_pool["{model}"]'
    step = planned(plan, f"{pool}.aws_autoscaling_policy.demand_surge")["step_adjustment"]
    (rule,) = planned(plan, "module.engines.aws_s3_bucket_lifecycle_configuration.engines")["rule"]
    user_data = base64.b64decode(planned(plan, f"{pool}.aws_launch_template.gpu")["user_data"]).decode()
    settings = edge_settings(plan, run_dir)
    return {
        "scale_in_drain_s": (
            planned(plan, f"{pool}.aws_autoscaling_lifecycle_hook.drain")["heartbeat_timeout"],
            # The host agent completes the terminate hook at the latest then.
            int(re.findall(r"--drain-s (\d+)", user_data)[0]),
        ),
        "wait_for_capacity_timeout": planned(plan, f"{pool}.aws_autoscaling_group.gpu")[
            "wait_for_capacity_timeout"
        ],
        "surge_demand": (
            planned(plan, f"{pool}.aws_cloudwatch_metric_alarm.demand_surge")["threshold"],
            # The step policy's bounds are relative to the alarm's: its larger step starts there.
            *(float(s["metric_interval_lower_bound"]) for s in step if not s["metric_interval_upper_bound"]),
        ),
        "interface_endpoints": sorted(
            c["index"]
            for c in plan["resource_changes"]
            if c["address"].startswith("module.network.aws_vpc_endpoint.interface[")
        ),
        "deregistration_delay_s": (
            int(planned(plan, "module.alb.aws_lb_target_group.edge")["deregistration_delay"]),
            # The edge ends its streams at the same time (its settings, as a task loads them).
            settings.server.drain_deadline_s,
        ),
        "members_per_replica": settings.fleet.members_per_replica,
        "noncurrent_version_days": rule["noncurrent_version_expiration"][0]["noncurrent_days"],
        "log_retention_days": {
            c["address"]: c["change"]["after"]["retention_in_days"]
            for c in plan["resource_changes"]
            if c["type"] == "aws_cloudwatch_log_group"
        },
    }


LOG_GROUPS = (
    "module.alb.aws_cloudwatch_log_group.waf",
    "module.edge.aws_cloudwatch_log_group.edge",
    "module.network.aws_cloudwatch_log_group.flow_logs",
    "module.redis.aws_cloudwatch_log_group.slow_log",
)


def test_each_knob_the_guide_names_reaches_the_resource_it_configures(
    plans: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    # iac/envs/example/tests/knobs.tftest.hcl sets each one away from its default.
    knobs = documented_knobs(plans["every_documented_knob"], tmp_path, "llama-3-8b")

    assert knobs == {
        "scale_in_drain_s": (900, 900),
        "wait_for_capacity_timeout": "45m",
        "surge_demand": (2, 2),
        "interface_endpoints": ["ecr.api", "ecr.dkr", "logs"],
        "deregistration_delay_s": (110, 110),
        "members_per_replica": 12,
        "noncurrent_version_days": 7,
        "log_retention_days": dict.fromkeys(
            [*LOG_GROUPS, 'module.gpu_pool["llama-3-8b"].aws_cloudwatch_log_group.triton'], 30
        ),
    }


def test_unset_knobs_keep_the_modules_defaults(plans: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    # settings.tftest.hcl sets none of them: the example's defaults are the modules' (and the edge's).
    knobs = documented_knobs(plans["dotted_model_names"], tmp_path, "qwen2.5-72b")

    def default(mod: str, variable: str) -> Any:
        return module(MODULES / mod).variables()[variable]["default"]

    drain, surge = default("gpu_pool", "scale_in_drain_s"), default("gpu_pool", "surge_demand")
    (days,) = {
        default(m, "log_retention_days") for m in ("alb", "edge_service", "network", "redis", "gpu_pool")
    }
    triton_logs = [f'module.gpu_pool["{m}"].aws_cloudwatch_log_group.triton' for m in DOTTED]
    assert knobs == {
        "scale_in_drain_s": (drain, drain),
        "wait_for_capacity_timeout": default("gpu_pool", "wait_for_capacity_timeout"),
        "surge_demand": (surge, surge),
        "interface_endpoints": sorted(default("network", "interface_endpoints")),
        # The edge's own drain_deadline_s default too (edge/defaults.toml).
        "deregistration_delay_s": (
            default("alb", "deregistration_delay_s"),
            load_settings().server.drain_deadline_s,
        ),
        # Every process divides every replica, as the edge's own default (0), unless set.
        "members_per_replica": load_settings().fleet.members_per_replica,
        "noncurrent_version_days": default("engine_bucket", "noncurrent_version_days"),
        "log_retention_days": dict.fromkeys([*LOG_GROUPS, *triton_logs], days),
    }
