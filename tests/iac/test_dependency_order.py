"""The order Terraform creates things in, read from its own dependency graph (`terraform graph` of
the example environment, providers from the local mirror). Each pair below broke an apply:

* the GPU hosts' role policy must not wait for their Auto Scaling group, and the group must wait
  for the policy: the group waits for hosts in service, and a host without the policy can neither
  pull its image nor complete its launch hook (a deadlock that timed out on every apply);
* the load balancer waits for its log bucket's policy (ELB refuses a bucket it may not write to);
* the ECS service waits for the HTTPS listener (ECS refuses a target group with no load balancer);
* the KMS key waits for the Auto Scaling service-linked role its policy names (a fresh account
  has none, and KMS refuses a policy naming a principal that does not exist);
* the terminate hook is its own resource, made after the group (so scale_in_drain_s is not part
  of the group)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from tests.iac.terraform_env import REPO, init, require_mirror

_EDGE = re.compile(r'^\s*"([^"]+)"\s*->\s*"([^"]+)"')


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    binary = require_mirror()
    work = tmp_path_factory.mktemp("graph")
    shutil.copytree(REPO / "iac", work / "iac")
    example = work / "iac" / "envs" / "example"
    env = init(binary, example, work)
    done = subprocess.run(
        [binary, "graph"], cwd=example, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    edges: dict[str, set[str]] = defaultdict(set)
    for line in done.stdout.splitlines():
        if match := _EDGE.match(line):
            edges[match.group(1)].add(match.group(2))
    assert edges, done.stdout[:2000]
    return edges


def waits_for(graph: dict[str, set[str]], node: str, dependency: str) -> bool:
    """Whether `node` is created only after `dependency` (a path of dependency edges)."""

    @cache
    def reach(current: str) -> frozenset[str]:
        found: set[str] = set()
        for nxt in graph.get(current, ()):
            found |= {nxt, *reach(nxt)}
        return frozenset(found)

    return dependency in reach(node)


GPU = "module.gpu_pool"


def test_the_gpu_group_waits_for_its_hosts_policy_and_not_the_reverse(graph: dict[str, set[str]]) -> None:
    group, policy = f"{GPU}.aws_autoscaling_group.gpu", f"{GPU}.aws_iam_role_policy.gpu"

    assert group in graph
    assert waits_for(graph, group, policy)
    assert not waits_for(graph, policy, group)


def test_the_load_balancer_waits_for_its_log_bucket_policy(graph: dict[str, set[str]]) -> None:
    assert waits_for(graph, "module.alb.aws_lb.this", "module.logs.aws_s3_bucket_policy.this")


def test_the_edge_service_waits_for_the_https_listener_and_its_rules(graph: dict[str, set[str]]) -> None:
    service = "module.edge.aws_ecs_service.edge"

    assert waits_for(graph, service, "module.alb.aws_lb_listener.https")
    assert waits_for(graph, service, "module.alb.aws_lb_listener_rule.public")


def test_the_edge_service_waits_for_its_execution_role_s_policies(graph: dict[str, set[str]]) -> None:
    # Without them its first tasks cannot pull the image, write logs or read their secrets.
    service = "module.edge.aws_ecs_service.edge"

    assert waits_for(graph, service, "module.edge.aws_iam_role_policy.execution_pull_and_log")
    assert waits_for(graph, service, "module.edge.aws_iam_role_policy.execution_secret")


def test_the_kms_key_waits_for_the_autoscaling_service_linked_role(graph: dict[str, set[str]]) -> None:
    role = "module.kms.aws_iam_service_linked_role.autoscaling"

    assert waits_for(graph, "module.kms.aws_kms_key.this", role)


def test_the_terminate_hook_is_its_own_resource_after_the_group(graph: dict[str, set[str]]) -> None:
    assert waits_for(graph, f"{GPU}.aws_autoscaling_lifecycle_hook.drain", f"{GPU}.aws_autoscaling_group.gpu")


def test_a_missing_mirror_is_reported_not_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.iac import terraform_env

    monkeypatch.setattr(terraform_env, "MIRROR", tmp_path / "no-mirror")

    with pytest.raises(pytest.skip.Exception, match="NOT RUN: no AWS provider mirror"):
        terraform_env.require_mirror()
