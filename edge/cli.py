"""`floodgate serve`, the operator's `keys`, `usage` and `config` (edge/keys_cli.py, edge/operator_cli.py),
the container's `healthcheck` (edge/healthcheck.py) and `floodgate chat` (the client's, from
client/floodgate_client/cli.py)."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time

import msgspec
from botocore.exceptions import BotoCoreError

from edge.config import ConfigError, Settings, load_settings
from edge.dynamodb_client import dynamodb_client
from edge.healthcheck import add_healthcheck_command
from edge.keys.cli_support import drop_stdout, opened_lifecycle, run
from edge.keys.legacy import BadKeysFile, read_keys_file
from edge.keys_cli import add_keys_commands
from edge.logging_setup import configure_logging
from edge.model_cli import add_model_command
from edge.model_source import prepare_model
from edge.models.served import default_model, served_models
from edge.operator_cli import add_operator_commands
from edge.sqlite_file import unopenable
from edge.stop_before_serving import StoppedBeforeServing, stop_on_sigterm
from edge.upstreams.asg_resolver import is_asg_spec
from floodgate_client.cli import EXIT_INTERRUPTED, add_chat_command
from gpu_container.checkpoint.errors import CheckpointError

# What a shell reports for a command SIGPIPE ended (128 + 13), as `cat`, `git log` or `ls` end
# under `| head`: Python ignores SIGPIPE, so its write fails instead (BrokenPipeError).
EXIT_BROKEN_PIPE = 141

DEV_USER = "dev"
DEV_TIER = "paid"


def _dev_key_hint(settings: Settings) -> None:
    async def dev_key() -> str | None:
        async with opened_lifecycle(settings, creates=True) as keys:
            if await keys.store.any_usable(time.time()):  # a key printed before still works
                return None
            key, _ = await keys.create(DEV_USER, DEV_TIER, "dev key of floodgate serve")
            return key

    key = run(dev_key, settings.keys)
    if key is None:
        return
    # Printed before the edge binds: port 0's is not known yet (the `edge_listening` log says it).
    port = settings.server.port or "PORT"
    # An IPv6 address (edge/server.py binds AF_INET6 for one) is bracketed in a URL: `http://::1:P`
    # is none curl takes.
    host = settings.server.host
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{port}/v1/chat/completions"
    # json.dumps: a model name may hold a '"' or a '\\', which pasted as it is made the body no JSON.
    body = json.dumps(
        {
            "model": default_model(settings, DEV_TIER),
            "stream": True,
            "messages": [{"role": "user", "content": "Hello!"}],
        }
    )
    print(
        f"No usable API key (none yet, or all revoked or expired): created one for user {DEV_USER!r} "
        f"(tier {DEV_TIER!r}). It is shown only once:"
    )
    print(f"  {key}")
    print("Try it, once the edge logs edge_serving:")
    headers = f"-H 'Authorization: Bearer {key}' -H 'Content-Type: application/json'"
    print(f"  curl -N {url} {headers} -d {shlex.quote(body)}")
    sys.stdout.flush()


def _serve(args: argparse.Namespace) -> int:
    # Installed first: the model's import and the app's making take seconds, during which a
    # SIGTERM was dropped where the edge is PID 1 (edge/stop_before_serving.py).
    with stop_on_sigterm():
        return _start_and_serve(args)


def _start_and_serve(args: argparse.Namespace) -> int:
    overrides: dict[str, dict[str, object]] = {"server": {}}
    # `is not None`: an empty value is one too. `--triton ""` (upstream.triton's own value for the
    # local CPU engines) was taken for "not given", and a config file's Triton replicas served;
    # `--host ""` bound the file's address, where server.host = "" is refused (every interface).
    if args.triton is not None:
        overrides["upstream"] = {"triton": args.triton}
    if args.host is not None:
        overrides["server"]["host"] = args.host
    if args.port is not None:
        # 0 too: a free port the kernel picks, as server.port = 0 is (the port bound is logged).
        overrides["server"]["port"] = args.port
    if args.ops_port is not None:
        # As --port: a second edge on one host (another checkout, a test run) met the first's
        # operator port, which only a config file could change.
        overrides["server"]["ops_port"] = args.ops_port
    try:
        settings = load_settings(args.config, overrides)
    except (ConfigError, msgspec.ValidationError) as exc:
        raise SystemExit(f"floodgate: invalid settings: {exc}") from None
    try:
        # Read again by the dev key's hint and by the app's start: a bad line was a traceback from
        # either, after the model's import (and, from the app, from every worker).
        read_keys_file(settings.server.keys_file, settings.tiers)
    except BadKeysFile as exc:
        raise SystemExit(f"floodgate: {settings.server.keys_file}: {exc}") from None
    sqlite_files = {
        f"{section}.sqlite_path": store.sqlite_path
        for section, store in (("keys", settings.keys), ("messages", settings.messages))
        if store.backend == "sqlite"
    }
    problem = unopenable(sqlite_files)
    if problem:
        raise SystemExit(f"floodgate: {problem}")
    for section, store in (("keys", settings.keys), ("messages", settings.messages)):
        if store.backend == "dynamodb":
            # Made (no request sent) before the model's import: a shell without an AWS region
            # started the edge, whose startup then failed with botocore's NoRegionError as an
            # exception group in a JSON log line, exit 3.
            try:
                dynamodb_client(store.dynamodb_endpoint)
            except BotoCoreError as exc:
                raise SystemExit(f'floodgate: {section}.backend = "dynamodb": {exc}') from None
    _refuse_unmade_group_clients(settings)
    if settings.metrics.cloudwatch:
        from edge.scaling.publisher import cloudwatch_client

        # Made (no request sent) here as well: without a region the edge served, and only a
        # warning each interval said that no scaling metric was ever published.
        try:
            cloudwatch_client(settings.metrics.cloudwatch_region or None)
        except BotoCoreError as exc:
            raise SystemExit(
                f"floodgate: metrics.cloudwatch = true: {exc} "
                "Set metrics.cloudwatch_region (or AWS_DEFAULT_REGION)"
            ) from None
    per_worker = None
    if args.workers > 1:
        from edge.workers import plan_workers

        # Before the model's import and the dev key: workers that cannot run are refused first.
        per_worker = plan_workers(overrides, settings, args.workers)
    else:
        from edge.server import refuse_taken_ports

        # Both ports, before the model's import and the dev key, as plan_workers does for workers.
        server = settings.server
        refuse_taken_ports([(server.host, server.port, ""), (server.ops_host, server.ops_port, "ops_port")])
    configure_logging()
    # httpx logs every request at INFO: a local tritonserver's readiness polls at start would flood it.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        for served in served_models(settings):
            prepare_model(served.model)
    except CheckpointError as exc:
        raise SystemExit(f"floodgate: cannot serve the model: {exc}") from None
    if settings.server.dev_key:
        _dev_key_hint(settings)
    if per_worker is not None:
        from edge.workers import serve_workers

        return serve_workers(args.config, per_worker)
    from edge.app import create_app
    from edge.gc_tuning import quiet_gc
    from edge.server import serve

    # Two listeners (public API, operator endpoints); SIGTERM drains (edge/server.py).
    app = create_app(settings)
    quiet_gc()
    serve(app, settings.server, app.state.drain)
    return 0


def _refuse_unmade_group_clients(settings: Settings) -> None:
    """The AWS clients of each Auto Scaling group a served model's replicas are found in, made (no
    request sent) before the model's import: a shell without an AWS region imported the model,
    printed the dev key, and the edge's startup then failed with botocore's NoRegionError as an
    exception group in a JSON log line, exit 3."""
    for served in served_models(settings):
        upstream = served.settings.upstream
        if not is_asg_spec(upstream.triton):
            continue
        own = settings.models.get(served.name)
        where = f"models.{served.name}.triton" if own and own.triton is not None else "upstream.triton"
        # Imported for a group alone: it brings in the Triton fleet's discovery.
        from edge.upstreams.triton_fleet import asg_resolver

        try:
            asg_resolver(upstream.triton, upstream.region)
        except BotoCoreError as exc:
            raise SystemExit(
                f'floodgate: {where} = "{upstream.triton}": {exc} Set upstream.region (or AWS_DEFAULT_REGION)'
            ) from None


def _worker_count(text: str) -> int:
    """`--workers N`, N >= 1: 0 or a negative count served one worker, as if 1 had been given."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count} workers: give at least 1")
    return count


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="floodgate", description="An open LLM-serving edge.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the edge (OpenAI-compatible API on HTTP)")
    serve.add_argument("--config", help="TOML file overriding the embedded defaults")
    serve.add_argument("--host", help="bind address (default: server.host)")
    serve.add_argument(
        "--port",
        type=int,
        help="port (default: server.port; 0: any free port, named in the edge_serving line)",
    )
    serve.add_argument(
        "--ops-port",
        type=int,
        help="operator port: /metrics, /healthz, /readyz (default: server.ops_port; 0: any free port)",
    )
    serve.add_argument(
        "--triton",
        metavar="local|HOST:PORT,...|asg:GROUP[:HTTP_PORT[:METRICS_PORT]]",
        help='serve from Triton replicas instead of the local CPU engines (default: upstream.triton; "": '
        "the local CPU engines)",
    )
    serve.add_argument(
        "--workers",
        type=_worker_count,
        default=1,
        help="edge processes sharing the port (SO_REUSEPORT), one per core; needs the redis limiter",
    )
    serve.set_defaults(handler=_serve)

    add_keys_commands(commands)
    add_operator_commands(commands)
    add_healthcheck_command(commands)
    add_chat_command(commands)
    add_model_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The exit code (the console script passes it to sys.exit)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        # Ctrl-C before the edge serves (a first start imports the model, 10-20 s of progress
        # lines) or during `model import`: a stop asked for, which was a traceback from deep in the
        # import. 130, the shell's code for a command SIGINT ended, as `floodgate chat` says too.
        print("floodgate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of standard output left before the end (`floodgate keys list | head`, `usage
        # --csv | head -1`): a traceback on stderr and exit 1, as if the command had failed. Quiet
        # instead, as `cat` is.
        drop_stdout()
        return EXIT_BROKEN_PIPE
    except StoppedBeforeServing:
        # A supervisor's stop: nothing served yet, so nothing to drain, and no failure.
        print("floodgate: stopped by SIGTERM before serving", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
