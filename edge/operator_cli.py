"""The operator's subcommands of `floodgate`: `config show` (more join it: keys, usage)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from edge.config import ConfigError, Settings, load_settings
from edge.settings_view import ascii_toml, effective_toml


def settings_of(args: argparse.Namespace) -> Settings:
    try:
        return load_settings(args.config)
    except (ConfigError, msgspec.ValidationError) as exc:
        raise SystemExit(f"floodgate: invalid settings: {exc}") from None


def _config_show(args: argparse.Namespace) -> int:
    document = effective_toml(settings_of(args))
    try:
        document.encode(sys.stdout.encoding or "utf-8")
    except UnicodeEncodeError:
        document = ascii_toml(document)
    print(document, end="")
    return 0


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML file overriding the embedded defaults")


def add_operator_commands(commands: Any) -> None:
    """`commands`: the `floodgate` parser's subparsers."""
    config = commands.add_parser("config", help="inspect the settings").add_subparsers(
        dest="config_command", required=True
    )
    show = config.add_parser("show", help="print the effective settings (defaults + file), secrets masked")
    add_config_option(show)
    show.set_defaults(handler=_config_show)
