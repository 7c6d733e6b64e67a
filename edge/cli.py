"""`floodgate serve`, `floodgate keys create` and `floodgate chat` (the client's, from client/cli.py)."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

import msgspec
import uvicorn

from client.cli import add_chat_command
from edge.auth import KeyStore, create_key
from edge.config import ConfigError, Settings, load_settings
from edge.logging_setup import configure_logging
from edge.operator_cli import add_operator_commands

DEV_USER = "dev"
DEV_TIER = "paid"


def _dev_key_hint(settings: Settings) -> None:
    keys_file = Path(settings.server.keys_file)
    if KeyStore(keys_file).has_keys():
        return
    key = create_key(keys_file, DEV_USER, DEV_TIER)
    url = f"http://{settings.server.host}:{settings.server.port}/v1/chat/completions"
    body = (
        f'{{"model": "{settings.model.name}", "stream": true, '
        '"messages": [{"role": "user", "content": "Hello!"}]}'
    )
    print(f"No API keys yet: created one for user {DEV_USER!r} (tier {DEV_TIER!r}). It is shown only once:")
    print(f"  {key}")
    print("Try it:")
    headers = f"-H 'Authorization: Bearer {key}' -H 'Content-Type: application/json'"
    print(f"  curl -N {url} {headers} -d {shlex.quote(body)}")
    sys.stdout.flush()


def _serve(args: argparse.Namespace) -> int:
    overrides: dict[str, dict[str, object]] = {"server": {}}
    if args.triton:
        overrides["upstream"] = {"triton": args.triton}
    if args.host:
        overrides["server"]["host"] = args.host
    if args.port:
        overrides["server"]["port"] = args.port
    try:
        settings = load_settings(args.config, overrides)
    except (ConfigError, msgspec.ValidationError) as exc:
        raise SystemExit(f"floodgate: invalid settings: {exc}") from None
    configure_logging()
    # httpx logs every request at INFO: the replicas' metrics polls would flood the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if settings.server.dev_key:
        _dev_key_hint(settings)
    from edge.app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        # uvicorn's own handlers would print plain text: its loggers go to the JSON root handler.
        log_config=None,
        timeout_graceful_shutdown=10,
    )
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if args.tier not in settings.tiers:
        raise SystemExit(f"unknown tier {args.tier!r}; configured: {', '.join(sorted(settings.tiers))}")
    keys_file = Path(args.keys_file or settings.server.keys_file)
    print(create_key(keys_file, args.user, args.tier))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="floodgate", description="An open LLM-serving edge.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the edge (OpenAI-compatible API on HTTP)")
    serve.add_argument("--config", help="TOML file overriding the embedded defaults")
    serve.add_argument("--host", help="bind address (default: server.host)")
    serve.add_argument("--port", type=int, help="port (default: server.port)")
    serve.add_argument(
        "--triton",
        metavar="local|HOST:PORT,...|asg:GROUP[:GRPC_PORT[:METRICS_PORT]]",
        help="serve from Triton replicas instead of in-process engines (default: upstream.triton)",
    )
    serve.set_defaults(handler=_serve)

    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(
        dest="keys_command", required=True
    )
    create = keys.add_parser("create", help="create a key and print it (the only time it is shown)")
    create.add_argument("--user", required=True)
    create.add_argument("--tier", required=True)
    create.add_argument("--keys-file", help="default: server.keys_file of the settings")
    create.add_argument("--config", help="TOML file overriding the embedded defaults")
    create.set_defaults(handler=_keys_create)

    add_operator_commands(commands)
    add_chat_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The exit code (the console script passes it to sys.exit)."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
