"""boto3 is imported where an AWS client is made, not by `import edge.app` or `import edge.cli`:
its import (with botocore.config) was about 0.2 s of CPU a process, paid by every `floodgate`
command and server start that never calls AWS (edge/aws_client.py). The clients keep their bounds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.iac.terraform_env import REPO

_LOADED = (
    "import sys; import {module}; print(sorted(m for m in ('boto3', 'botocore.config') if m in sys.modules))"
)


@pytest.mark.parametrize("module", ["edge.app", "edge.cli"])
def test_importing_the_edge_leaves_boto3_unloaded(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED.format(module=module)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_the_clients_keep_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    from edge.dynamodb_client import dynamodb_client
    from edge.scaling.publisher import cloudwatch_client

    dynamodb = dynamodb_client("http://127.0.0.1:1")
    assert (dynamodb.meta.config.connect_timeout, dynamodb.meta.config.read_timeout) == (2, 5)
    # botocore counts the first try too: 3 retries are 4 attempts.
    assert dynamodb.meta.config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert dynamodb.meta.endpoint_url == "http://127.0.0.1:1"
    cloudwatch = cloudwatch_client("us-east-2")
    assert cloudwatch.meta.region_name == "us-east-2"
    assert (cloudwatch.meta.config.connect_timeout, cloudwatch.meta.config.read_timeout) == (2, 3)
    assert cloudwatch.meta.config.retries == {"mode": "standard", "total_max_attempts": 2}
