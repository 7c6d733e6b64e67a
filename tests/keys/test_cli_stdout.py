"""`floodgate` commands whose standard output takes no more: its reader gone (`| head`), a full disk
(`> key.txt`), in a real child process."""

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


def _floodgate(config: Path | None, stdout: int, *argv: str) -> tuple[int, str]:
    """`floodgate *argv` writing to `stdout`: its exit code and stderr. `config`: None for a command
    that reads no settings."""
    settings = [] if config is None else ["--config", str(config)]
    command = [sys.executable, "-m", "edge.cli", *argv, *settings]
    done = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60)
    return done.returncode, done.stderr


def _into_closed_pipe(config: Path | None, *argv: str) -> tuple[int, str]:
    """As `floodgate … | head` once head has left: every write to stdout fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return _floodgate(config, write, *argv)
    finally:
        os.close(write)


def _into_full_disk(config: Path | None, *argv: str) -> tuple[int, str]:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        return _floodgate(config, fd, *argv)
    finally:
        os.close(fd)


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


@pytest.mark.parametrize("into", [_into_full_disk, _into_closed_pipe])
def test_a_key_created_that_cannot_be_printed_is_revoked(
    capsys: pytest.CaptureFixture[str], config: Path, into: object
) -> None:
    """`floodgate keys create … > key.txt` on a full disk (or into a pipe whose reader has gone)
    ended in a traceback with the key stored and working, shown to nobody: a credential no one
    holds, and a retry made a second. It is revoked, and one line says so."""
    assert callable(into)
    code, err = into(config, "keys", "create", "--user", "bea", "--tier", "free")
    [key] = _keys(capsys, config)
    assert code == 1 and "Traceback" not in err, err
    assert key["status"] == "revoked"
    [said] = [line for line in err.splitlines() if line.startswith("floodgate:")]
    assert f"{key['id']} is revoked" in said


def test_a_rotation_whose_key_cannot_be_printed_says_how_to_end_it(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """The rotation stands (its old key keeps its grace), and the line names the command that ends
    the unread key at once, in place of a traceback."""
    run(capsys, config, "keys", "create", "--user", "cy", "--tier", "free")
    [old] = _keys(capsys, config)
    code, err = _into_full_disk(config, "keys", "rotate", str(old["id"]))
    new = next(k for k in _keys(capsys, config) if k["id"] != old["id"])
    assert code == 1 and "Traceback" not in err, err
    assert f"floodgate keys rotate {new['id']} --grace-s 0" in err
    run(capsys, config, "keys", "rotate", str(new["id"]), "--grace-s", "0")
    status = {k["id"]: k["status"] for k in _keys(capsys, config)}
    assert status[new["id"]] == "expired" and status[old["id"]] == "active"


@pytest.mark.parametrize("into", [_into_full_disk, _into_closed_pipe])
def test_an_admin_key_that_cannot_be_printed_gives_no_hash(into: object) -> None:
    """`floodgate keys admin-key > admin.txt` on a full disk printed the hash setting, then a
    traceback: an operator who put that hash in the settings let in a key nobody had. No hash is
    given for a key not shown, and one line says so."""
    assert callable(into)
    code, err = into(None, "keys", "admin-key")
    assert code == 1 and "Traceback" not in err, err
    assert "admin_key_sha256" not in err
    [said] = [line for line in err.splitlines() if line.startswith("floodgate:")]
    assert "no admin key was made" in said
