"""`floodgate` commands whose standard output takes no more (its reader gone: `| head`), in a real
child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.keys import test_cli
from tests.keys.test_cli import run

config = test_cli.config  # the fixture: a settings file naming a fresh SQLite store

EXIT_BROKEN_PIPE = 141


def _floodgate(config: Path, stdout: int, *argv: str) -> tuple[int, str]:
    """`floodgate *argv` writing to `stdout`: its exit code and stderr."""
    command = [sys.executable, "-m", "edge.cli", *argv, "--config", str(config)]
    done = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60)
    return done.returncode, done.stderr


def _into_closed_pipe(config: Path, *argv: str) -> tuple[int, str]:
    """As `floodgate … | head` once head has left: every write to stdout fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return _floodgate(config, write, *argv)
    finally:
        os.close(write)


def _keys(capsys: pytest.CaptureFixture[str], config: Path) -> list[dict[str, object]]:
    keys: list[dict[str, object]] = json.loads(run(capsys, config, "keys", "list", "--json"))
    return keys


@pytest.mark.parametrize(
    "argv", [("config", "show"), ("keys", "list"), ("keys", "list", "--json"), ("usage", "--csv")]
)
def test_a_reader_gone_before_the_end_is_no_traceback(
    capsys: pytest.CaptureFixture[str], config: Path, argv: tuple[str, ...]
) -> None:
    """`floodgate keys list | head` printed a BrokenPipeError traceback and exited 1, as a failure.
    It ends quietly, 141, as a command SIGPIPE ends (`cat`, `git log`) does."""
    run(capsys, config, "keys", "create", "--user", "ann", "--tier", "free")
    code, err = _into_closed_pipe(config, *argv)
    assert (code, err) == (EXIT_BROKEN_PIPE, "")
