"""Import a GGUF file into a Hugging Face-style checkpoint directory the engine loads, cached.

The result lives in `<models_dir>/<name>-<sha256 prefix>/`: config.json, model.safetensors
(float32, no lm_head when the head is tied), tokenizer.json, tokenizer_config.json and import.json
(what was imported, by which format version). It is written into a `.partial` staging directory
and renamed into place whole, so a crash mid-import leaves nothing under the final name; a staging
directory whose process is gone is removed by the next import.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file

from gpu_container.checkpoint.dequantize import check_types, dequantized
from gpu_container.checkpoint.errors import CheckpointError, UnsupportedModel
from gpu_container.checkpoint.gguf_file import GgufFile
from gpu_container.checkpoint.gguf_tokenizer import build_tokenizer, tokenizer_config
from gpu_container.checkpoint.hf_config import hf_config
from gpu_container.checkpoint.progress import Progress
from gpu_container.checkpoint.rope_permutation import unpermute_rows
from gpu_container.checkpoint.tensor_names import hf_name
from gpu_container.engine.arrays import Floats
from gpu_container.engine.llama_config import LlamaConfig
from gpu_container.engine.weights import check_layout

# Bump whenever the import writes something different: older cache entries are then rebuilt.
IMPORT_FORMAT = 1
RECORD = "import.json"
_STAGING = re.compile(r"^\..+\.(\d+)\.[^.]+\.partial$")


def import_gguf(
    gguf_path: Path, models_dir: Path, *, name: str | None = None, progress: Progress | None = None
) -> Path:
    """The checkpoint directory for `gguf_path`, imported unless the cache already holds it."""
    gguf_path, models_dir = Path(gguf_path), Path(models_dir)
    if not gguf_path.is_file():
        raise CheckpointError(f"{gguf_path}: no such GGUF file")
    digest = sha256_of(gguf_path)
    target = models_dir / f"{name or _slug(gguf_path.stem)}-{digest[:16]}"
    if is_imported(target, digest):
        return target
    try:
        return _import_into(gguf_path, models_dir, target, digest, progress)
    except OSError as exc:
        # A cache it cannot make or write (a file in the way, a directory the operator may not
        # write, a full disk) was an OSError traceback from `floodgate model import` and from
        # `serve`'s first start; said as a checkpoint error, it is their one-line message.
        raise CheckpointError(f"{models_dir}: cannot write the model cache: {exc}") from None


def _import_into(
    gguf_path: Path, models_dir: Path, target: Path, digest: str, progress: Progress | None
) -> Path:
    models_dir.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(models_dir)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".partial", dir=models_dir)
    )
    staging.chmod(0o755)  # mkdtemp makes it private; the import is for every user of the cache
    try:
        _write(gguf_path, staging, digest, progress)
        for written in staging.iterdir():
            # Its files too: safetensors writes the weights 0600, and another user of the cache
            # found the checkpoint and its tokenizer but could not open the weights.
            written.chmod(0o644)
        if target.exists():
            _discard(target)  # an older format's import
        try:
            os.rename(staging, target)
        except OSError:
            # Another process renamed its own complete import into place first.
            if not is_imported(target, digest):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def is_imported(directory: Path, digest: str) -> bool:
    try:
        record = json.loads((directory / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(record.get("format") == IMPORT_FORMAT and record.get("sha256") == digest)


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write(gguf_path: Path, out: Path, digest: str, progress: Progress | None) -> None:
    gguf = GgufFile(gguf_path)
    tensors = gguf.tensors
    check_types(gguf_path, tensors)
    names = [hf_name(gguf_path, t.name) for t in tensors]
    config = hf_config(gguf, tied="lm_head.weight" not in names)
    # Built before the long part, so an unsupported tokenizer is refused at once.
    tokenizer = build_tokenizer(gguf)
    weights: dict[str, Floats] = {}
    for done, (tensor, hf) in enumerate(zip(tensors, names, strict=True), start=1):
        weights[hf] = _hf_layout(gguf_path, hf, dequantized(tensor), config)
        if progress is not None:
            progress(done, len(tensors), tensor.name)
    try:
        # What the engine's load checks (gpu_container/engine/loader.py): a GGUF short of a tensor,
        # or with one of another shape, imported into a cached checkpoint every start then refused.
        check_layout(LlamaConfig.from_hf(config), {hf: tuple(w.shape) for hf, w in weights.items()})
    except ValueError as exc:
        raise UnsupportedModel(f"{gguf_path}: {exc}") from None
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    del weights
    _write_json(out / "config.json", config)
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=False), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", tokenizer_config(gguf))
    # Last: its presence marks a complete import (the rename already makes it all-or-nothing).
    _write_json(out / RECORD, {"format": IMPORT_FORMAT, "sha256": digest, "source": gguf_path.name})


def _hf_layout(path: Path, name: str, weight: Floats, config: dict[str, Any]) -> Floats:
    try:
        if name.endswith("self_attn.q_proj.weight"):
            return unpermute_rows(weight, int(config["num_attention_heads"]))
        if name.endswith("self_attn.k_proj.weight"):
            return unpermute_rows(weight, int(config["num_key_value_heads"]))
    except ValueError as exc:
        raise CheckpointError(f"{path}: tensor {name!r} of shape {weight.shape}: {exc}") from exc
    return weight


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _slug(stem: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.") or "model"


def _remove_abandoned(models_dir: Path) -> None:
    """Staging directories left by a process that died mid-import (its pid is in the name)."""
    for entry in models_dir.iterdir():
        match = _STAGING.match(entry.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _discard(directory: Path) -> None:
    """Move a directory out of the way atomically (a racing reader never sees it half gone)."""
    trash = Path(tempfile.mkdtemp(prefix=f".{directory.name}.trash.", dir=directory.parent))
    with contextlib.suppress(FileNotFoundError):
        os.rename(directory, trash / directory.name)
    shutil.rmtree(trash, ignore_errors=True)
