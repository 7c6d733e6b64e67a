#!/bin/sh
# The edge task's start command (Dockerfile.edge installs it as /usr/local/bin/floodgate-start; the
# edge_service module runs it). Settings and keys arrive as environment variables from the task
# definition and Secrets Manager; this writes them to files in the task volume, with the Redis AUTH
# token spliced into the settings, so no secret sits in the task definition, then execs the server.
#
#   FLOODGATE_CONFIG_TOML  the settings (iac/envs/example/edge.toml.tftpl), with @REDIS_AUTH_TOKEN@
#   REDIS_AUTH_TOKEN       the token (Secrets Manager)
#   FLOODGATE_KEYS_JSONL   hashed API keys from the api-keys secret, imported insert-only at start
#                          (may be empty: keys live in the keys table)
#   FLOODGATE_RUN_DIR      where the files go (default /run/floodgate, the task's volume)
#   FLOODGATE_WORKERS      edge processes sharing the port, one per vCPU (default 1; more needs
#                          the redis limiter): `floodgate serve --workers`, edge/workers.py
set -eu

run_dir=${FLOODGATE_RUN_DIR:-/run/floodgate}

fail() {
  echo "floodgate-start: $*" >&2
  exit 1
}

[ -n "${FLOODGATE_CONFIG_TOML:-}" ] || fail "FLOODGATE_CONFIG_TOML is empty"
# Production settings must never let the edge make and print a development key (into the logs):
# keys come from the keys table (`floodgate keys create`), the secret's file is only imported.
# The setting itself, a line of [server], not the words anywhere: `# dev_key = false` (commented
# out, so the default, true) passed, and `dev_key=false` (the same TOML) was refused.
dev_key_off() {
  printf '%s\n' "$FLOODGATE_CONFIG_TOML" | awk '
    /^[[:space:]]*\[/ { table = $0; sub(/#.*/, "", table); gsub(/[[:space:]]/, "", table); next }
    table == "[server]" && /^[[:space:]]*dev_key[[:space:]]*=[[:space:]]*false[[:space:]]*(#.*)?\r?$/ { off = 1 }
    END { exit !off }'
}
dev_key_off || fail "the settings must say [server] dev_key = false"

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
printf '%s' "${FLOODGATE_KEYS_JSONL:-}" | grep -v '^[[:space:]]*$' >"$run_dir/keys.jsonl" || true

exec floodgate serve --workers "${FLOODGATE_WORKERS:-1}" --config "$run_dir/config.toml"
