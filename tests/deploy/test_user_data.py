"""The GPU hosts' user data (iac/modules/gpu_pool/user_data.sh.tftpl), rendered as Terraform renders
it and run for real by bash, with stand-ins for curl (the instance metadata service), aws and docker
that record how they were called. A host whose set-up fails must abandon its launch at once (the
group replaces it now, and says why), never leave the launch hook to time out."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.documented import USER_DATA
from tests.support.boto3_region import region_boto3_resolves

VALUES = {
    "region": "us-east-1",
    "registry": "111122223333.dkr.ecr.us-east-1.amazonaws.com",
    "image": "111122223333.dkr.ecr.us-east-1.amazonaws.com/fg/triton:1",
    "engine_s3_uri": "s3://fg-engines/engines/llama/l40s/",
    "group_name": "fg-gpu-llama",
    "ready_hook": "fg-gpu-llama-ready",
    "drain_hook": "fg-gpu-llama-drain",
    "ready_timeout": "1740",
    "drain_s": "300",
    "log_group": "/floodgate/fg-gpu-llama/triton",
    "metric_ns": "Floodgate/GPU",
}

STAND_IN = """#!/bin/bash
echo "$(basename "$0") $*" >> "$CALLS"
# As the real docker login does: read the password from the pipe (a reader that exits first would
# SIGPIPE the writer, and pipefail would fail the boot on a race of the stand-in's own making).
[[ "$*" == *--password-stdin* ]] && cat > /dev/null
case "$(basename "$0") $1 $2" in
  "curl -sf -X") echo token ;;
  "curl -sf -H") echo i-0123456789 ;;
  "aws ecr get-login-password") echo password ;;
esac
[[ "$(basename "$0") $1" == "$FAIL" ]] && exit 1
exit 0
"""


def render() -> str:
    template = USER_DATA.read_text()
    used = set(re.findall(r"\$\{(\w+)\}", template))
    assert used == set(VALUES), used ^ set(VALUES)
    return re.sub(r"\$\{(\w+)\}", lambda m: VALUES[m.group(1)], template)


def run_user_data(tmp_path: Path, fail: str = "") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # curl, aws, docker: the outside world; install and tee: so nothing is written outside tmp_path.
    for name in ("curl", "aws", "docker", "install", "tee"):
        (bin_dir / name).write_text(STAND_IN if name != "tee" else "#!/bin/sh\nexec cat\n")
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "user_data.sh"
    script.write_text(render())
    calls = tmp_path / "calls"
    done = subprocess.run(
        ["bash", str(script)],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "FAIL": fail},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


ABANDON = (
    "aws autoscaling complete-lifecycle-action --region us-east-1 --auto-scaling-group-name fg-gpu-llama "
    "--lifecycle-hook-name fg-gpu-llama-ready --instance-id i-0123456789 --lifecycle-action-result ABANDON"
)


def test_a_good_boot_starts_triton_and_the_agent_and_leaves_the_hook_to_the_agent(tmp_path: Path) -> None:
    done, calls = run_user_data(tmp_path)
    runs = [c for c in calls if c.startswith("docker run")]

    assert done.returncode == 0, done.stderr
    assert not any("complete-lifecycle-action" in c for c in calls)
    assert len(runs) == 2
    triton, agent = runs
    assert "--name triton" in triton and "--gpus all" in triton and "--log-driver awslogs" in triton
    assert "awslogs-group=/floodgate/fg-gpu-llama/triton" in triton
    assert triton.endswith(VALUES["image"])  # the image's own command: the serving entrypoint
    assert "python3 -m gpu_container.triton.host_agent --group fg-gpu-llama" in agent
    assert "--ready-hook fg-gpu-llama-ready --drain-hook fg-gpu-llama-drain" in agent


@pytest.mark.parametrize("fail", ["docker login", "docker pull", "docker run"])
def test_a_failed_step_abandons_the_launch_at_once(tmp_path: Path, fail: str) -> None:
    done, calls = run_user_data(tmp_path, fail=fail)

    assert done.returncode == 1
    assert calls[-1] == ABANDON
    assert "abandoning this launch" in done.stderr + done.stdout


def test_both_containers_give_boto3_its_region(tmp_path: Path) -> None:
    """The agent's boto3 clients (and the engine fetch's) find the region in the environment the
    user data gives each container, as boto3 resolves it: AWS_DEFAULT_REGION, never AWS_REGION.
    Without it the agent died at start (NoRegionError) and no host ever joined its group."""
    done, calls = run_user_data(tmp_path)
    assert done.returncode == 0, done.stderr
    for run in (c for c in calls if c.startswith("docker run")):
        env = dict(re.findall(r"-e (\w+)=(\S+)", run))
        assert region_boto3_resolves(env, tmp_path) == VALUES["region"], run
