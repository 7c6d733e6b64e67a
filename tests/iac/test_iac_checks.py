"""scripts/iac-checks.sh: terraform fmt, checkov with zero failed checks, and, where the AWS provider
mirror exists, terraform validate and `terraform test` (mocked provider) of every module and
environment with tests. The first run on a machine installs checkov into .venv-checkov (about a minute)."""

from __future__ import annotations

import subprocess

import pytest

from tests.iac.terraform_env import REPO, has_mirror


@pytest.fixture(scope="module")
def checks() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "iac-checks.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=590,
    )


@pytest.mark.timeout(600)
def test_iac_checks_pass(checks: subprocess.CompletedProcess[str]) -> None:
    assert checks.returncode == 0, checks.stdout[-6000:] + checks.stderr[-6000:]
    assert "Failed checks: 0" in checks.stdout


@pytest.mark.timeout(600)
def test_terraform_test_ran_on_every_module_with_tests(checks: subprocess.CompletedProcess[str]) -> None:
    if not has_mirror():
        assert "iac-checks: SKIPPED terraform validate and terraform test" in checks.stdout
        pytest.skip("NOT RUN: terraform test needs the AWS provider mirror (see iac-checks output)")
    modules = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "iac").glob("*/*/tests"))

    assert "iac/envs/example" in modules and "iac/modules/gpu_pool" in modules, modules
    for name in modules:
        assert f"iac-checks: terraform test {name}" in checks.stdout
    assert checks.stdout.count("Success!") >= len(modules)
    assert "iac-checks: terraform tests passed" in checks.stdout
