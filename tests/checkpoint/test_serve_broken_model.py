"""`floodgate serve` on a broken checkpoint stops before serving, naming the file, no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.live_server import demo_model_dir
from tests.support.ports import free_port


def test_serve_names_the_missing_file(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(demo_model_dir(), checkpoint)
    (checkpoint / "tokenizer.json").unlink()
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\npath = "{checkpoint}"\n[server]\nops_port = 0\nkeys_file = "{tmp_path / "keys.jsonl"}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
    )
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(free_port())]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"floodgate: cannot serve the model: {checkpoint}/tokenizer.json: missing" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
