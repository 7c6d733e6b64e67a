"""The edge task's start script (scripts/edge-start.sh, `floodgate-start` in the image), run for real
by sh, as the image's non-root user (uid 10001), with a stand-in `floodgate`.

The task's settings volume is a Fargate bind mount. Fargate mounts it root-owned 0755 unless the
image declares the path a VOLUME, whose ownership the mount then takes (ECS developer guide, bind
mounts). `fargate_mount` makes the directory the way Fargate would from what Dockerfile.edge says,
so the image's start script meets the directory a real task would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.iac.hcl import EXAMPLE
from tests.iac.terraform_env import REPO

SCRIPT = REPO / "scripts" / "edge-start.sh"
DOCKERFILE = REPO / "Dockerfile.edge"
UID = 10001
MOUNT = "/run/floodgate"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="NOT RUN: needs root and setpriv to run the script as uid 10001 against a root-owned mount",
)


def image_prepares_the_mount() -> bool:
    """Dockerfile.edge declares MOUNT a VOLUME and creates it owned by the image's user."""
    text = DOCKERFILE.read_text()
    volume = re.search(r'^VOLUME \["?' + re.escape(MOUNT) + r'"?\]', text, re.MULTILINE)
    owned = re.search(r"install -d -o floodgate -g floodgate .*" + re.escape(MOUNT), text)
    user = re.search(r"useradd .*--uid " + str(UID) + r" .*floodgate", text)
    return bool(volume and owned and user)


def fargate_mount(root: Path) -> Path:
    """The task volume as Fargate mounts it for this image."""
    mount = root / "run-floodgate"
    mount.mkdir(mode=0o755)
    os.chown(mount, *((UID, UID) if image_prepares_the_mount() else (0, 0)))
    return mount


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A temp folder uid 10001 can reach (pytest's own sits under a root-only 0700 folder)."""
    root = Path(tempfile.mkdtemp(prefix="floodgate-edge-start-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


@pytest.fixture
def stand_in(tmp_path: Path) -> dict[str, str]:
    """A `floodgate` that says how it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "floodgate"
    fake.write_text('#!/bin/sh\necho "started: $*"\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/nonexistent"}


def reachable(run_dir: Path) -> Path:
    """The start script where uid 10001 can read it. The image installs it world-readable; the
    checkout may sit under a folder that uid cannot enter (a `mktemp -d` clone is 0700)."""
    script = run_dir.parent / "edge-start.sh"
    shutil.copyfile(SCRIPT, script)
    script.chmod(0o755)
    return script


def start(
    env: dict[str, str], run_dir: Path, keys: str, token: str = "tok3n"
) -> subprocess.CompletedProcess[str]:
    settings = (EXAMPLE / "edge.toml.tftpl").read_text()
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "sh", str(reachable(run_dir))],
        env={
            **env,
            "FLOODGATE_RUN_DIR": str(run_dir),
            "FLOODGATE_CONFIG_TOML": settings,
            "REDIS_AUTH_TOKEN": token,
            "FLOODGATE_KEYS_JSONL": keys,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )


KEYS = '{"key_sha256": "ab", "user": "u1", "tier": "paid"}'


def test_the_task_starts_as_the_image_user_on_the_fargate_mount(
    stand_in: dict[str, str], tmp_path: Path
) -> None:
    mount = fargate_mount(tmp_path)
    # A token with characters sed would have read as syntax.
    done = start(stand_in, mount, KEYS, token="a/b&c\\d")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"started: serve --workers 1 --config {mount}/config.toml"
    settings = (mount / "config.toml").read_text()
    assert 'redis_url = "rediss://:a/b&c\\d@' in settings
    assert "@REDIS_AUTH_TOKEN@" not in settings
    assert (mount / "keys.jsonl").read_text() == KEYS + "\n"
    assert (mount / "keys.jsonl").stat().st_uid == UID
    assert (mount / "keys.jsonl").stat().st_mode & 0o077 == 0


def test_a_root_owned_mount_fails_loudly(stand_in: dict[str, str], tmp_path: Path) -> None:
    mount = tmp_path / "root-owned"
    mount.mkdir(mode=0o755)

    done = start(stand_in, mount, KEYS)

    assert done.returncode == 1
    assert "started" not in done.stdout
    assert f"{mount} (0:0 755) is not writable by uid {UID}" in done.stderr


def test_an_empty_keys_secret_is_fine_keys_live_in_the_table(
    stand_in: dict[str, str], tmp_path: Path
) -> None:
    mount = fargate_mount(tmp_path)

    done = start(stand_in, mount, "\n")

    assert done.returncode == 0, done.stderr
    assert (mount / "keys.jsonl").read_text() == ""


def start_with(env: dict[str, str], run_dir: Path, settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "sh", str(reachable(run_dir))],
        env={
            **env,
            "FLOODGATE_RUN_DIR": str(run_dir),
            "FLOODGATE_CONFIG_TOML": settings,
            "REDIS_AUTH_TOKEN": "t",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )


EXAMPLE_DEV_KEY = "dev_key = false"


@pytest.mark.parametrize(
    "line",
    [
        "dev_key = true",
        # Commented out: the edge's default, true, which made and printed a key into the task's logs.
        "# dev_key = false",
        "#dev_key = false",
    ],
)
def test_settings_that_allow_a_dev_key_are_refused(
    stand_in: dict[str, str], tmp_path: Path, line: str
) -> None:
    mount = fargate_mount(tmp_path)
    settings = (EXAMPLE / "edge.toml.tftpl").read_text()
    assert settings.count(EXAMPLE_DEV_KEY) == 1

    done = start_with(stand_in, mount, settings.replace(EXAMPLE_DEV_KEY, line))

    assert done.returncode == 1
    assert "started" not in done.stdout
    assert "dev_key = false" in done.stderr


@pytest.mark.parametrize(
    "line",
    # The same TOML as the example's line, spelled as an operator may spell it.
    ["dev_key=false", "dev_key  =  false", "  dev_key = false   # never a dev key", "dev_key = false\r"],
)
def test_dev_key_off_in_any_spelling_starts(stand_in: dict[str, str], tmp_path: Path, line: str) -> None:
    mount = fargate_mount(tmp_path)
    settings = (EXAMPLE / "edge.toml.tftpl").read_text().replace(EXAMPLE_DEV_KEY, line)

    done = start_with(stand_in, mount, settings)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"started: serve --workers 1 --config {mount}/config.toml"


def test_the_image_installs_the_script_the_task_runs() -> None:
    text = DOCKERFILE.read_text()

    assert "COPY scripts/edge-start.sh /usr/local/bin/floodgate-start" in text
    assert os.access(SCRIPT, os.X_OK)
