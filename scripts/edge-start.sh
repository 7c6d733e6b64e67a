#!/bin/sh
# The edge task's start command (Dockerfile.edge installs it as /usr/local/bin/floodgate-start; the
# edge_service module runs it). Settings and keys arrive as environment variables from the task
# definition and Secrets Manager; this writes them to files in the task volume, with the Redis AUTH
# token spliced into the settings, so no secret sits in the task definition, then execs the server.
#
#   FLOODGATE_CONFIG_TOML  the settings (iac/envs/example/edge.toml.tftpl), with @REDIS_AUTH_TOKEN@
#   REDIS_AUTH_TOKEN       the token (Secrets Manager)
#   FLOODGATE_KEYS_JSONL   the hashed API keys (Secrets Manager)
#   FLOODGATE_RUN_DIR      where the files go (default /run/floodgate, the task's volume)
set -eu

run_dir=${FLOODGATE_RUN_DIR:-/run/floodgate}

fail() {
  echo "floodgate-start: $*" >&2
  exit 1
}

# No keys: refuse, because an edge without keys makes a development key and prints it, into the logs.
if [ -z "$(printf '%s' "${FLOODGATE_KEYS_JSONL:-}" | tr -d '[:space:]')" ]; then
  fail "the api-keys secret holds no keys"
fi
[ -n "${FLOODGATE_CONFIG_TOML:-}" ] || fail "FLOODGATE_CONFIG_TOML is empty"

# Fargate mounts the task volume root-owned 0755 unless the image declares it a VOLUME owned by its
# user: say so plainly instead of dying on the first write.
if [ ! -d "$run_dir" ] || [ ! -w "$run_dir" ]; then
  owner=$(stat -c '%u:%g %a' "$run_dir" 2>/dev/null || echo missing)
  fail "$run_dir ($owner) is not writable by uid $(id -u): the image must create it owned by that user and declare it a VOLUME"
fi

umask 077
config=$FLOODGATE_CONFIG_TOML
placeholder=@REDIS_AUTH_TOKEN@
case $config in
  *"$placeholder"*)
    # Parameter expansion, not sed: the token may hold any character sed would read as syntax.
    config="${config%%"$placeholder"*}${REDIS_AUTH_TOKEN:?REDIS_AUTH_TOKEN is empty}${config#*"$placeholder"}"
    ;;
esac
printf '%s\n' "$config" >"$run_dir/config.toml"
printf '%s\n' "$FLOODGATE_KEYS_JSONL" >"$run_dir/keys.jsonl"

exec floodgate serve --config "$run_dir/config.toml"
