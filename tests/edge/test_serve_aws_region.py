"""`floodgate serve` whose settings need an AWS client in a shell with no AWS region: said in one
line naming the setting, before the model's import, as the DynamoDB stores are
(tests/keys/test_cli_dynamodb.py). Run as the operator runs it, as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.live_server import demo_model_dir

REPO = Path(__file__).resolve().parents[2]


def _no_region_env(home: Path) -> dict[str, str]:
    """Credentials but no region anywhere boto3 looks (environment, ~/.aws/config, the instance)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_EC2_METADATA_DISABLED="true",
        HOME=str(home),
    )
    return env


def _config(tmp_path: Path, more: str) -> Path:
    """The demo model served from `tmp_path`, with `more` tables."""
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "demo"\nname = "m"\ndemo_dir = "{demo_model_dir()}"\n'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nport = 0\nops_port = 0\n'
        "drain_accept_s = 0.0\ndrain_deadline_s = 0.0\n"
        f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n{more}'
    )
    return config


def _serve(tmp_path: Path, more: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge.cli", "serve", "--config", str(_config(tmp_path, more)), *argv],
        cwd=REPO,
        env=_no_region_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_refused(done: subprocess.CompletedProcess[str], line: str) -> None:
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr + done.stdout, done.stdout[-2000:]
    # Before the dev key (nothing on stdout) and the model's import.
    assert done.stdout == "", done.stdout[-2000:]
    assert done.stderr.strip().splitlines() == [line], done.stderr[-2000:]


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
@pytest.mark.parametrize("where", ["flag", "models"])
def test_serve_on_an_auto_scaling_group_without_a_region_is_said_before_it_starts(
    tmp_path: Path, where: str
) -> None:
    """`--triton asg:GROUP` (or a [models.NAME] triton naming one) with no upstream.region and none
    in the shell: the edge imported the model, printed the dev key, then its startup failed with
    botocore's NoRegionError as an exception group logged in a JSON line, exit 3."""
    if where == "flag":
        done = _serve(tmp_path, "", "--triton", "asg:gpus")
        setting = "upstream.triton"
    else:
        done = _serve(tmp_path, '[models.big]\nsource = "demo"\ntriton = "asg:gpus"\n')
        setting = "models.big.triton"
    _assert_refused(
        done,
        f'floodgate: {setting} = "asg:gpus": You must specify a region. '
        "Set upstream.region (or AWS_DEFAULT_REGION)",
    )


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_publishing_to_cloudwatch_without_a_region_is_said_before_it_starts(tmp_path: Path) -> None:
    """[metrics] cloudwatch = true with no cloudwatch_region and none in the shell: the edge served,
    and each minute's publish failed with a NoRegionError warning in the log, so the GPU groups
    that scale on its metrics never saw any."""
    config = _config(tmp_path, "[metrics]\ncloudwatch = true\n")
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config)]
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=_no_region_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # to its exit, or to the line that says it serves
            lines.append(line)
            assert "edge_listening" not in line, "".join(lines)[-2000:]
        assert proc.wait(timeout=60) == 1
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert "Traceback" not in "".join(lines), "".join(lines)[-2000:]
    assert [line.strip() for line in lines] == [
        "floodgate: metrics.cloudwatch = true: You must specify a region. "
        "Set metrics.cloudwatch_region (or AWS_DEFAULT_REGION)"
    ]
