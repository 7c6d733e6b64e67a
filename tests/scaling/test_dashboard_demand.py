"""The dashboard's demand per replica, as Terraform plans it (iac/modules/monitoring, mocked
provider), on what two edges published to CloudWatch (moto): the figure the scaling policies act
on, at whatever period the console draws it."""

from __future__ import annotations

import json
import re
import shutil
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from edge.scaling import DemandSignal, ScalingPublisher, metric
from tests.iac.terraform_env import REPO, init, planned, planned_runs, require_mirror
from tests.scaling.conftest import PutRecorder
from tests.scaling.test_demand import PRICE, Edge, replicas

pytestmark = pytest.mark.anyio

MODEL = "llama-3.1-8b"  # the model of iac/modules/monitoring/tests/alarms.tftest.hcl


def planned_dashboard(tmp_path: Path) -> dict[str, Any]:
    binary = require_mirror()
    monitoring = tmp_path / "monitoring"
    source = REPO / "iac" / "modules" / "monitoring"
    shutil.copytree(source, monitoring, ignore=shutil.ignore_patterns(".terraform*"))
    env = init(binary, monitoring, tmp_path)
    plan = next(iter(planned_runs(binary, monitoring, env, "tests/alarms.tftest.hcl").values()))
    return dict(json.loads(planned(plan, "aws_cloudwatch_dashboard.this")["dashboard_body"]))


def demand_queries(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The demand widget's metrics as GetMetricData queries (Period set later), and the expression
    it draws for MODEL."""
    for widget in body["widgets"]:
        rows = widget["properties"]["metrics"]
        drawn = [r[0] for r in rows if isinstance(r[0], dict) and r[0].get("label") == MODEL]
        if not drawn:
            continue
        queries = []
        for row in rows:
            if isinstance(row[0], dict):
                continue
            namespace, name, dimension, value, options = row
            queries.append(
                {
                    "Id": options["id"],
                    "MetricStat": {
                        "Metric": {
                            "Namespace": namespace,
                            "MetricName": name,
                            "Dimensions": [{"Name": dimension, "Value": value}],
                        },
                        "Stat": options["stat"],
                    },
                }
            )
        return queries, drawn[0]["expression"]
    raise AssertionError(f"no widget draws {MODEL}'s demand")


def evaluate(expression: str, values: dict[str, float], period_s: int) -> float:
    """CloudWatch metric math of the widget's shape on one timestamp's values: MAX([...]),
    arithmetic, and PERIOD(m), the period the console queried m at."""
    python = re.sub(r"PERIOD\(\w+\)", str(period_s), expression).replace("MAX(", "max(")
    assert set(re.findall(r"[A-Za-z_]\w*", python)) <= {"max", *values}, expression
    result: float = eval(python, {"__builtins__": {}, "max": max}, values)
    return result


async def test_the_dashboards_demand_reads_the_same_at_any_period(
    tmp_path: Path, recorder: PutRecorder, cloudwatch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dashboard's period adapts to its time range (periodOverride "auto", CloudWatch's default):
    # an operator looking at a day or a week gets 5-minute or hourly points. The widget divided a
    # period's Sum by the samples of one minute (6), so at 5 minutes it drew 5 x the demand the
    # policies act on, at an hour 60 x: a fleet held at its 0.8 target read as 4.0, double the
    # demand-high alarm's 2.
    queries, expression = demand_queries(planned_dashboard(tmp_path))

    # Two edges, each asked 3 requests a second of 0.6 replica-seconds over 4 live replicas with
    # room: 0.45 per edge, 0.9 for the fleet (docs/deploy.md's worked example, without the queue).
    start = (int(datetime.now(UTC).timestamp()) // 3600 - 2) * 3600  # on an hour, so on every period
    clock = types.SimpleNamespace(now=float(start))
    monkeypatch.setattr("edge.scaling.publisher.time", types.SimpleNamespace(time=lambda: clock.now))
    minutes = 10
    for _ in range(2):
        edge = Edge(replicas(4, running=10, waiting=0, held_each=5))
        signal = DemandSignal(edge, PRICE)
        publisher = ScalingPublisher(
            signal.sample, dimensions=metric.dimensions(MODEL), client_factory=recorder.client
        )
        # A call a minute, as the running publisher makes them, this one at :45 (its last sample's
        # time): each call's samples are credited to the minute it is made in (publisher.py).
        for k in range(minutes * metric.SAMPLES_PER_PERIOD):
            clock.now = start - 5 + k * metric.SAMPLE_INTERVAL_S
            edge.ask(3 * metric.SAMPLE_INTERVAL_S)
            publisher.sample()
            if (k + 1) % metric.SAMPLES_PER_PERIOD == 0:
                assert await publisher.flush()

    drawn: dict[int, list[float]] = {}
    for period_s in (60, 300):
        answer = cloudwatch.get_metric_data(
            MetricDataQueries=[{**q, "MetricStat": {**q["MetricStat"], "Period": period_s}} for q in queries],
            StartTime=datetime.fromtimestamp(start, UTC),
            EndTime=datetime.fromtimestamp(start + minutes * 60, UTC),
        )
        results = answer["MetricDataResults"]
        series = {r["Id"]: dict(zip(r["Timestamps"], r["Values"], strict=True)) for r in results}
        stamps = sorted(set.intersection(*(set(s) for s in series.values())))
        assert len(stamps) == minutes * 60 // period_s
        at = [{i: s[t] for i, s in series.items()} for t in stamps]
        drawn[period_s] = [evaluate(expression, values, period_s) for values in at]

    assert drawn[60] == pytest.approx([0.9] * minutes)
    assert drawn[300] == pytest.approx([0.9] * 2)
