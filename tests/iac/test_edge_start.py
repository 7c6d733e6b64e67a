"""The edge task's start command (edge_service module), run by sh with a stand-in `floodgate`: it
writes the settings with the Redis token spliced in and the keys file, and refuses to start
without keys (an edge without keys would print a fresh development key into the logs)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.iac.hcl import EXAMPLE, MODULES, module


def start_command(run_dir: Path) -> str:
    expression = module(MODULES / "edge_service").locals()["start_command"]
    prefix = '${join(" && ", '
    assert expression.startswith(prefix) and expression.endswith(")}")
    parts: list[str] = json.loads(expression[len(prefix) : -2])
    return " && ".join(parts).replace("/run/floodgate", str(run_dir))


@pytest.fixture
def stand_in(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "floodgate"
    fake.write_text('#!/bin/sh\necho "started: $*"\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run(env: dict[str, str], run_dir: Path, keys: str) -> subprocess.CompletedProcess[str]:
    settings = (EXAMPLE / "edge.toml.tftpl").read_text()
    return subprocess.run(
        ["sh", "-c", start_command(run_dir)],
        env={
            **env,
            "FLOODGATE_CONFIG_TOML": settings,
            "REDIS_AUTH_TOKEN": "tok3n",
            "FLOODGATE_KEYS_JSONL": keys,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_start_writes_settings_and_keys_then_serves(stand_in: dict[str, str], tmp_path: Path) -> None:
    keys = '{"key_sha256": "ab", "user": "u1", "tier": "paid"}'

    done = run(stand_in, tmp_path, keys)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"started: serve --config {tmp_path}/config.toml"
    settings = (tmp_path / "config.toml").read_text()
    assert 'redis_url = "rediss://:tok3n@' in settings
    assert "@REDIS_AUTH_TOKEN@" not in settings
    assert (tmp_path / "keys.jsonl").read_text() == keys + "\n"


def test_start_refuses_an_empty_keys_secret(stand_in: dict[str, str], tmp_path: Path) -> None:
    done = run(stand_in, tmp_path, "\n")

    assert done.returncode == 1
    assert "started" not in done.stdout
    assert "no keys" in done.stderr
