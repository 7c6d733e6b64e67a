"""Which GPU replicas an EC2 Auto Scaling group holds now: `asg:GROUP[:HTTP_PORT[:METRICS_PORT]]`.

A replica is an instance the group counts as InService and Healthy. Everything else is not one yet
or not any more: Pending (still booting Triton), Terminating / Detaching / Standby, and the warm
pool's instances (their lifecycle states are `Warmed:*`, and a stopped one has no Triton running).

The calls are boto3's, blocking: callers run `replica_specs()` in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREFIX = "asg:"
DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 8002


class AsgResolveError(Exception):
    """The group could not be read (unknown group, AWS error): keep the replicas known so far."""


@dataclass(frozen=True, slots=True)
class AsgSpec:
    group: str
    http_port: int = DEFAULT_HTTP_PORT
    metrics_port: int = DEFAULT_METRICS_PORT


def is_asg_spec(spec: str) -> bool:
    return spec.strip().startswith(PREFIX)


def parse_asg_spec(spec: str) -> AsgSpec:
    """`asg:GROUP[:HTTP_PORT[:METRICS_PORT]]`; ports default to Triton's 8000 and 8002."""
    parts = spec.strip().removeprefix(PREFIX).split(":")
    if not is_asg_spec(spec) or not parts[0] or len(parts) > 3:
        raise ValueError(f"expected asg:GROUP[:HTTP_PORT[:METRICS_PORT]], got {spec!r}")
    try:
        ports = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"ports must be numbers in {spec!r}") from None
    return AsgSpec(parts[0], *ports)


class AsgResolver:
    """Reads the group through the given boto3 clients (`autoscaling`, `ec2`)."""

    def __init__(self, spec: AsgSpec, autoscaling: Any, ec2: Any) -> None:
        self.spec = spec
        self._autoscaling = autoscaling
        self._ec2 = ec2

    def instance_ids(self) -> list[str]:
        """The group's InService, Healthy instances."""
        try:
            answer = self._autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.spec.group])
        except Exception as exc:  # botocore's errors: credentials, throttling, network, …
            raise AsgResolveError(f"{self.spec.group}: {type(exc).__name__}: {exc}") from exc
        groups = answer.get("AutoScalingGroups", [])
        if not groups:
            raise AsgResolveError(f"no Auto Scaling group named {self.spec.group!r}")
        return sorted(
            instance["InstanceId"]
            for instance in groups[0].get("Instances", [])
            if instance.get("LifecycleState") == "InService" and instance.get("HealthStatus") == "Healthy"
        )

    def private_ips(self) -> list[str]:
        """The private IPv4 addresses of the group's replicas that EC2 reports running."""
        ids = self.instance_ids()
        if not ids:
            return []
        ips: list[str] = []
        try:
            pages = self._ec2.get_paginator("describe_instances").paginate(InstanceIds=ids)
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for instance in reservation.get("Instances", []):
                        running = instance.get("State", {}).get("Name") == "running"
                        if running and instance.get("PrivateIpAddress"):
                            ips.append(instance["PrivateIpAddress"])
        except Exception as exc:
            raise AsgResolveError(f"{self.spec.group}: {type(exc).__name__}: {exc}") from exc
        return sorted(ips)

    def replica_specs(self) -> list[str]:
        """`HOST:HTTP_PORT:METRICS_PORT` of every replica, as `--triton` takes them."""
        s = self.spec
        return [f"{ip}:{s.http_port}:{s.metrics_port}" for ip in self.private_ips()]
