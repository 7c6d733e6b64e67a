"""A crash mid-import (SIGKILL, not an exception) leaves nothing that loads; the next import
finishes and removes what the dead one left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_container.checkpoint.errors import CheckpointError
from gpu_container.checkpoint.facts import read_facts
from gpu_container.checkpoint.gguf_import import import_gguf, sha256_of
from tests.checkpoint.tiny_gguf import write_tiny_gguf

# Imports with a progress callback that announces the third tensor and then never returns.
_STALLED_IMPORT = """
import sys, threading
from pathlib import Path
from gpu_container.checkpoint.gguf_import import import_gguf
def stall(done, total, name):
    if done == 3:
        print("stalled", flush=True)
        threading.Event().wait()
import_gguf(Path(sys.argv[1]), Path(sys.argv[2]), progress=stall)
"""


def test_a_killed_import_leaves_no_loadable_model(tmp_path: Path) -> None:
    source, models = tmp_path / "tiny.gguf", tmp_path / "models"
    write_tiny_gguf(source)
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALLED_IMPORT, str(source), str(models)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "stalled"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    left = list(models.iterdir())
    assert [entry.name.endswith(".partial") for entry in left] == [True]  # only the staging dir
    target = models / f"tiny-{sha256_of(source)[:16]}"
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        read_facts(target)

    assert import_gguf(source, models) == target
    assert [entry.name for entry in models.iterdir()] == [target.name]  # the dead one's dir is gone
    assert read_facts(target).config.num_hidden_layers == 1


def test_a_failing_import_leaves_nothing(tmp_path: Path) -> None:
    source, models = tmp_path / "tiny.gguf", tmp_path / "models"
    write_tiny_gguf(source)

    def fail(done: int, total: int, name: str) -> None:
        if done == 2:
            raise OSError("disk full")

    # Said as a CheckpointError naming the cache (`model import`'s and `serve`'s one-line message).
    with pytest.raises(CheckpointError, match=r"models: cannot write the model cache: disk full"):
        import_gguf(source, models, progress=fail)
    assert list(models.iterdir()) == []
