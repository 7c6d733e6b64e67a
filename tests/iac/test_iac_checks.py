"""scripts/iac-checks.sh's test part: where the AWS provider mirror exists, terraform validate of the
example environment and `terraform test` (mocked provider) of every module and environment with
tests. Its lint part (terraform fmt, checkov) is `make lint`'s."""

from __future__ import annotations

import subprocess

import pytest

from tests.iac.terraform_env import REPO, has_mirror


@pytest.mark.timeout(600)
def test_terraform_validate_and_test_pass_on_every_module_with_tests() -> None:
    checks = subprocess.run(
        ["bash", str(REPO / "scripts" / "iac-checks.sh"), "test"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=590,
    )
    output = checks.stdout[-6000:] + checks.stderr[-6000:]
    if not has_mirror():
        assert checks.returncode == 0, output
        assert "iac-checks: SKIPPED terraform validate and terraform test" in checks.stdout
        pytest.skip("NOT RUN: terraform test needs the AWS provider mirror (see iac-checks output)")
    assert checks.returncode == 0, output
    assert "Success! The configuration is valid." in checks.stdout
    modules = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "iac").glob("*/*/tests"))
    assert "iac/envs/example" in modules and "iac/modules/gpu_pool" in modules, modules
    for name in modules:
        assert f"iac-checks: terraform test {name}" in checks.stdout
    assert checks.stdout.count("Success!") >= len(modules) + 1
    assert "iac-checks: terraform tests passed" in checks.stdout
    # The lint part is left to `make lint`: no checkov install in a test run.
    assert "checkov" not in checks.stdout
