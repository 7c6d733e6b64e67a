"""Ctrl-C at a `floodgate keys` command's worst moments, in a real child process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edge.cli import main
from tests.keys import test_cli
from tests.keys.test_cli import run, user_of
from tests.support.from_a_terminal import as_from_a_terminal
from tests.support.held_key_store import HELD

config = test_cli.config  # the fixture: a settings file naming a fresh SQLite store


def _rotate_interrupted(config: Path, key_id: str, moment: str) -> tuple[int, str, str]:
    """`keys rotate key_id`, sent SIGINT once its store holds it (`moment`, held_key_store's):
    the exit code, stdout and stderr."""
    return _interrupted(config, moment, "keys", "rotate", key_id)


def _interrupted(config: Path, moment: str, *argv: str) -> tuple[int, str, str]:
    """`floodgate *argv`, sent SIGINT once its store holds it (`moment`, held_key_store's): the exit
    code, stdout and stderr."""
    command = [sys.executable, "-m", "tests.support.held_key_store", moment, *argv, "--config", str(config)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal
    ) as child:
        assert child.stderr is not None
        before: list[str] = []
        for line in child.stderr:
            before.append(line)
            if line.strip() == HELD:
                break
        else:
            raise AssertionError(f"the store never held the command: {''.join(before)}")
        child.send_signal(signal.SIGINT)
        try:
            out, err = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()  # else the `with`'s own wait held the test process for good
            raise AssertionError(f"SIGINT did not end the command: {''.join(before)}") from None
    return child.returncode, out, "".join(before) + err


def _keys(capsys: pytest.CaptureFixture[str], config: Path) -> dict[str, dict[str, object]]:
    return {k["id"]: k for k in json.loads(run(capsys, config, "keys", "list", "--json"))}


@pytest.mark.parametrize("moment", ["added", "before"])
def test_a_rotate_interrupted_before_its_retire_revokes_the_key_it_made(
    capsys: pytest.CaptureFixture[str], config: Path, moment: str
) -> None:
    """Ctrl-C with the new key stored and the old one not yet retired (or the insert's answer not
    yet back) left the new key live, shown to nobody. It is revoked, and the old key is as it was,
    as said."""
    old = run(capsys, config, "keys", "create", "--user", "erin", "--tier", "free").strip()
    [old_id] = _keys(capsys, config)
    code, out, err = _rotate_interrupted(config, old_id, moment)
    assert code == 130 and out == "", err
    keys = _keys(capsys, config)
    [new_id] = set(keys) - {old_id}
    assert keys[new_id]["status"] == "revoked", keys
    assert keys[old_id]["status"] == "active" and keys[old_id]["replaced_by"] is None, keys
    assert user_of(config, old) == "erin"
    assert f"{old_id} was not rotated" in err and "Traceback" not in err, err
    # Nothing stands in the way of the rotation tried again.
    assert main(["keys", "rotate", old_id, "--config", str(config)]) == 0


def test_a_rotate_interrupted_once_its_retire_landed_shows_the_new_key(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """Ctrl-C while the retire's answer was awaited, the write made: the rotation stands (no store
    takes a replacement back), so its new key is printed, as an uninterrupted rotate prints it."""
    old = run(capsys, config, "keys", "create", "--user", "fay", "--tier", "free").strip()
    [old_id] = _keys(capsys, config)
    code, out, err = _rotate_interrupted(config, old_id, "after")
    assert code == 0 and "Traceback" not in err, err
    new = out.strip()
    keys = _keys(capsys, config)
    [new_id] = set(keys) - {old_id}
    assert keys[old_id]["replaced_by"] == new_id and keys[new_id]["status"] == "active", keys
    assert user_of(config, new) == user_of(config, old) == "fay"
    assert f"{new_id} replaces {old_id}" in err, err


@pytest.mark.parametrize("moment", ["added", "announced"])
def test_a_create_interrupted_before_its_key_is_shown_revokes_it(
    capsys: pytest.CaptureFixture[str], config: Path, moment: str
) -> None:
    """Ctrl-C with the key stored and not yet printed (the insert's answer awaited, or its
    announcement to the edges, which a slow Redis holds for its timeout) left a key that works and
    that nobody was shown. It is revoked, and the command says so in one line and exits 130."""
    code, out, err = _interrupted(config, moment, "keys", "create", "--user", "gus", "--tier", "free")
    assert code == 130 and out == "", err
    assert "Traceback" not in err and "floodgate: interrupted" in err, err
    [stored] = _keys(capsys, config).values()
    assert stored["status"] == "revoked" and stored["user"] == "gus", stored
    assert "no working key was created" in err, err


def test_a_create_interrupted_while_its_store_closes_shows_its_key(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """Ctrl-C once the key was made, while the store closed: the key was lost with the command's
    result (a traceback-free exit 130, the key live and shown to nobody). It is printed before the
    store closes, and the command, done, exits 0."""
    code, out, err = _interrupted(config, "closing", "keys", "create", "--user", "hal", "--tier", "free")
    assert code == 0 and "Traceback" not in err, err
    key = out.strip()
    [stored] = _keys(capsys, config).values()
    assert stored["status"] == "active" and user_of(config, key) == "hal", (stored, err)
    assert f"created {stored['id']}" in err, err


def test_a_rotate_interrupted_while_its_store_closes_shows_the_new_key(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """As create's: the rotation had landed (the old key expiring at its grace's end) and its new
    key, shown to nobody, was lost with the command's result."""
    old = run(capsys, config, "keys", "create", "--user", "ivy", "--tier", "free").strip()
    [old_id] = _keys(capsys, config)
    code, out, err = _rotate_interrupted(config, old_id, "closing")
    assert code == 0 and "Traceback" not in err, err
    new = out.strip()
    keys = _keys(capsys, config)
    [new_id] = set(keys) - {old_id}
    assert keys[old_id]["replaced_by"] == new_id and user_of(config, new) == user_of(config, old) == "ivy"
    assert f"{new_id} replaces {old_id}" in err, err
