"""Open a GGUF file with the `gguf` library and read its metadata as plain Python values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader

from gpu_container.checkpoint.errors import CheckpointError


class GgufFile:
    """A GGUF file's metadata and tensors (memory-mapped: tensors are read when dequantized)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such GGUF file")
        try:
            self.reader = GGUFReader(self.path)
        except Exception as exc:  # the reader raises ValueError, KeyError, IndexError... on bad bytes
            raise CheckpointError(
                f"{self.path}: not a readable GGUF file (truncated or corrupt?): {exc}"
            ) from exc
        self._check_tensor_extents()

    def value(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        value = self.value(key)
        if value is None:
            raise CheckpointError(f"{self.path}: metadata key {key!r} is missing")
        return value

    @property
    def tensors(self) -> list[Any]:
        return list(self.reader.tensors)

    def _check_tensor_extents(self) -> None:
        # The reader maps tensors lazily: a file cut short mid-data only shows as a short array.
        size = self.path.stat().st_size
        for tensor in self.reader.tensors:
            end = int(tensor.data_offset) + int(tensor.n_bytes)
            if end > size or tensor.data.nbytes != int(tensor.n_bytes):
                raise CheckpointError(
                    f"{self.path}: tensor {tensor.name!r} runs past the end of the file "
                    f"({end} > {size} bytes): the file is truncated"
                )
