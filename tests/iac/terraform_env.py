"""Running the real terraform against the local AWS provider mirror (providers cannot be downloaded
here). Where the mirror or terraform is missing, `require_mirror` skips with the reason: a check
that did not run is reported as not run, never as passed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ.get("TF_PROVIDER_MIRROR", "/opt/tf-plugins"))
# terraform and the AWS provider (Go) spend about a third of their CPU collecting garbage at Go's
# default GOGC=100, and every run block starts the provider anew: at 400 the example environment's
# `terraform test` took 50-53 s of CPU against 66-77 (2-core AMD EPYC, alternating), at about 0.5
# GB against 0.36. scripts/iac-checks.sh sets the same; a caller's own GOGC wins.
GO_GC = {"GOGC": os.environ.get("GOGC", "400")}


def terraform_binary() -> str | None:
    found = shutil.which("terraform")
    if found:
        return found
    wrapped = REPO / ".venv-checkov" / "bin" / "terraform"
    return str(wrapped) if wrapped.exists() else None


def has_mirror() -> bool:
    return (MIRROR / "registry.terraform.io" / "hashicorp" / "aws").is_dir()


def require_mirror() -> str:
    """The terraform binary; skips the calling test, saying why, when it cannot run here."""
    binary = terraform_binary()
    if binary is None:
        pytest.skip("NOT RUN: no terraform binary (scripts/iac-checks.sh installs one)")
    if not has_mirror():
        pytest.skip(f"NOT RUN: no AWS provider mirror at {MIRROR} (set TF_PROVIDER_MIRROR)")
    return binary


def init(binary: str, config_dir: Path, home: Path) -> dict[str, str]:
    """`terraform init` of `config_dir` from the mirror; returns the environment to run it in."""
    rc = home / "terraform.rc"
    rc.write_text(
        f'plugin_cache_dir = "{MIRROR}"\n'
        "plugin_cache_may_break_dependency_lock_file = true\n"
        f'provider_installation {{\n  filesystem_mirror {{\n    path = "{MIRROR}"\n'
        '    include = ["registry.terraform.io/hashicorp/*"]\n  }\n}\n'
    )
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(rc), "TF_IN_AUTOMATION": "1", **GO_GC}
    done = subprocess.run(
        [binary, "init", "-backend=false", "-input=false", "-no-color"],
        cwd=config_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return env


def planned_runs(
    binary: str, config_dir: Path, env: dict[str, str], *files: str
) -> dict[str, dict[str, Any]]:
    """`terraform test` of `files` (under config_dir, mocked providers): each run block's plan, as
    `terraform show -json` gives it (`-verbose` puts it in the JSON output), by run name. The runs'
    own assertions must pass."""
    done = subprocess.run(
        [binary, "test", "-json", "-verbose", "-no-color", *(f"-filter={f}" for f in files)],
        cwd=config_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    messages = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    problems = [
        f"{m['@message']}: {m['diagnostic'].get('detail', '')}" for m in messages if m["type"] == "diagnostic"
    ]
    assert done.returncode == 0, "\n".join(problems) or done.stderr[-3000:]
    return {m["@testrun"]: m["test_plan"] for m in messages if m["type"] == "test_plan"}


def planned(plan: dict[str, Any], address: str) -> dict[str, Any]:
    """The planned values of the resource at `address` (module path included)."""
    for change in plan["resource_changes"]:
        if change["address"] == address:
            return dict(change["change"]["after"])
    raise KeyError(f"{address} is not in the plan")
