"""The GPU group's scaling numbers, read from iac/ (not copied by hand): what the simulated
autoscaler obeys, so a change to the Terraform changes the simulation.

Sources: iac/modules/gpu_pool/variables.tf (defaults; main.tf's warm pool coalesces an unset
warm_pool_max_prepared to warm_pool_min_size), iac/envs/example/variables.tf (the `models`
map's per-model overrides), iac/modules/gpu_pool/scaling.tf (policy warm-up, step adjustments, alarm
periods) and iac/modules/scaling_metric/outputs.tf (metric period and samples per period).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hcl2

IAC = Path(__file__).resolve().parents[2] / "iac"


@dataclass(frozen=True)
class ScalingSettings:
    min_size: int
    max_size: int
    warm_pool_min_size: int
    warm_pool_max_prepared: int | None  # None: warm_pool_min_size (prepared_capacity)
    demand_target: float  # target tracking holds demand per replica here
    surge_demand: float  # step policy's alarm threshold
    surge_steps: tuple[tuple[float, float | None, int], ...]  # (lower, upper, +percent) above threshold
    surge_datapoints: int  # periods at or above surge_demand before the step policy acts
    instance_warmup_s: int  # estimated_instance_warmup of the policies
    scale_in_drain_s: int  # longest a leaving host waits for its streams
    metric_period_s: int
    samples_per_period: int
    model: str

    @property
    def prepared_capacity(self) -> int:
        """AWS's MaxGroupPreparedCapacity as gpu_pool/main.tf sets it: coalesce(warm_pool_max_prepared,
        warm_pool_min_size); -1 is AWS's default (max_size)."""
        if self.warm_pool_max_prepared is None:
            return self.warm_pool_min_size
        return self.warm_pool_max_prepared

    def with_overrides(self, **changes: Any) -> ScalingSettings:
        return replace(self, **changes)


def _unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _blocks(doc: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """`variable`/`output`/... blocks by unquoted name."""
    out: dict[str, dict[str, Any]] = {}
    for block in doc.get(kind, []):
        for name, body in block.items():
            out[_unquote(name)] = body
    return out


def _resources(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for block in doc.get("resource", []):
        for rtype, named in block.items():
            for name, body in named.items():
                out[(_unquote(rtype), _unquote(name))] = body
    return out


def _load(path: Path) -> dict[str, Any]:
    with path.open() as fh:
        return dict(hcl2.load(fh))


def _number(value: Any, setting: Callable[[str], float]) -> float:
    """A literal, or `${var.NAME}` resolved by `setting` (the model's own value or the default)."""
    value = _unquote(value)
    if isinstance(value, str) and value.startswith("${var.") and value.endswith("}"):
        return setting(value[6:-1])
    return float(value)


def read(iac: Path = IAC, model: str | None = None) -> ScalingSettings:
    """The settings of one model's GPU group as the example environment deploys it."""
    pool = iac / "modules" / "gpu_pool"
    variables = _blocks(_load(pool / "variables.tf"), "variable")
    resources = _resources(_load(pool / "scaling.tf"))
    outputs = _blocks(_load(iac / "modules" / "scaling_metric" / "outputs.tf"), "output")
    env = _blocks(_load(iac / "envs" / "example" / "variables.tf"), "variable")
    models: dict[str, dict[str, Any]] = {_unquote(k): v for k, v in env["models"]["default"].items()}
    name = model or next(iter(models))
    per_model = models[name]

    # The model's own value where var.models sets it, as the example passes it to gpu_pool.
    def setting(key: str) -> float:
        return float(per_model[key]) if key in per_model else float(variables[key]["default"])

    # The example passes no warm_pool_max_prepared to gpu_pool: the module's default.
    max_prepared = variables["warm_pool_max_prepared"]["default"]

    target = resources[("aws_autoscaling_policy", "demand_target")]
    surge = resources[("aws_autoscaling_policy", "demand_surge")]
    alarm = resources[("aws_cloudwatch_metric_alarm", "demand_surge")]
    steps = []
    for step in surge["step_adjustment"]:
        upper = step.get("metric_interval_upper_bound")
        steps.append(
            (
                # Bounds naming var.surge_demand: the model's own, as its alarm's threshold.
                _number(step["metric_interval_lower_bound"], setting),
                None if upper is None else _number(upper, setting),
                int(step["scaling_adjustment"]),
            )
        )
    return ScalingSettings(
        min_size=int(setting("min_size")),
        max_size=int(setting("max_size")),
        warm_pool_min_size=int(setting("warm_pool_min_size")),
        warm_pool_max_prepared=None if max_prepared is None else int(max_prepared),
        demand_target=setting("demand_target"),
        surge_demand=setting("surge_demand"),
        surge_steps=tuple(steps),
        surge_datapoints=int(alarm["datapoints_to_alarm"]),
        instance_warmup_s=int(target["estimated_instance_warmup"]),
        scale_in_drain_s=int(setting("scale_in_drain_s")),
        metric_period_s=int(_unquote(outputs["period_s"]["value"])),
        samples_per_period=int(_unquote(outputs["samples_per_period"]["value"])),
        model=name,
    )
