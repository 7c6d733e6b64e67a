"""scripts/iac-checks.sh: terraform fmt, checkov with zero failed checks, and terraform validate where a
provider mirror exists. The first run on a machine installs checkov into .venv-checkov (about a minute)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_iac_checks_pass() -> None:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "iac-checks.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=590,
    )

    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    assert "Failed checks: 0" in done.stdout
