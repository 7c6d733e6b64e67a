#!/usr/bin/env bash
# Install what the test suite needs from Debian and npm, only where it is missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v chromium-headless-shell >/dev/null || need+=(chromium-headless-shell)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v ss >/dev/null || need+=(iproute2)  # tests/faults: a listener's backlog
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "system-deps: missing ${need[*]} and not root; the tests that need them will skip" >&2
    exit 0
  fi
  echo "system-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
