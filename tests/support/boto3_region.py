"""The region boto3 itself resolves from an environment alone: how a container's AWS clients that
name no region find theirs (AWS_DEFAULT_REGION; never AWS_REGION in this botocore)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def region_boto3_resolves(environment: dict[str, str], home: Path) -> str:
    """boto3's region in a fresh interpreter given only `environment` (no config file, no instance
    metadata); "None" when it finds none."""
    resolved = subprocess.run(
        [sys.executable, "-c", "import boto3; print(boto3.session.Session().region_name)"],
        env={
            **environment,
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "AWS_EC2_METADATA_DISABLED": "true",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resolved.returncode == 0, resolved.stderr[-300:]
    return resolved.stdout.strip()
