"""`floodgate keys …`, `usage` and `serve` on a DynamoDB key store that fails them (moto here, in a
module of its own, since a module holding moto's starter makes each of its tests a server test): run
as the operator runs them, as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.moto_server import REGION, aws_client, running_moto

REPO = Path(__file__).resolve().parents[2]
COMMANDS = (
    ["keys", "list"],
    ["keys", "create", "--user", "alice", "--tier", "free"],
    ["usage"],
    ["serve", "--port", "0"],
)


def floodgate(config: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge.cli", *argv, "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def aws_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", **extra)
    return env


def config_file(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "floodgate.toml"
    path.write_text(
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nops_port = 0\n'
        f'[keys]\nbackend = "dynamodb"\ndynamodb_table = "{table}"\n'
    )
    return path


def assert_said_in_one_line(
    done: subprocess.CompletedProcess[str],
    *words: str,
    said: str = "floodgate: the key store (DynamoDB table ",
) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(said), done.stderr
    for word in words:
        assert word in lines[-1], done.stderr


def test_a_key_table_that_does_not_exist_is_said_not_a_traceback(tmp_path: Path) -> None:
    """A mistyped dynamodb_table (or one Terraform has not made yet): botocore's
    ResourceNotFoundException was a traceback from every key command, `usage` and `serve`."""
    config = config_file(tmp_path, "no-such-table")
    with running_moto() as endpoint:
        env = aws_env(AWS_ENDPOINT_URL_DYNAMODB=endpoint, AWS_DEFAULT_REGION=REGION)
        for argv in COMMANDS:
            assert_said_in_one_line(floodgate(config, argv, env), "'no-such-table'", "ResourceNotFound")


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: "-".join(argv[:2]))
def test_no_aws_region_is_said_not_a_traceback(tmp_path: Path, argv: list[str]) -> None:
    """botocore's NoRegionError (an operator's shell without AWS_DEFAULT_REGION) was a traceback."""
    done = floodgate(config_file(tmp_path, "floodgate-keys"), argv, aws_env())
    # serve says it before the model's import (the test below), naming the setting.
    said = 'floodgate: keys.backend = "dynamodb": ' if argv[0] == "serve" else "floodgate: the key store"
    assert_said_in_one_line(done, "region", said=said)


@pytest.mark.parametrize("section", ["keys", "messages"])
def test_serve_on_dynamodb_without_a_region_is_said_before_it_starts(tmp_path: Path, section: str) -> None:
    """A store on DynamoDB (keys without a dev key, or the conversation messages) in a shell without
    AWS_DEFAULT_REGION: the edge started, imported the model, and its startup failed with botocore's
    NoRegionError as an exception group logged in a JSON line, exit 3."""
    stores = {name: f'sqlite_path = "{tmp_path / name}.db"\n' for name in ("keys", "messages")}
    stores[section] = 'backend = "dynamodb"\n'
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nport = 0\nops_port = 0\ndev_key = false\n'
        + "".join(f"[{name}]\n{lines}" for name, lines in stores.items())
    )
    done = floodgate(config, ["serve"], aws_env())
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout, done.stdout[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f'floodgate: {section}.backend = "dynamodb": You must specify a region.'
    ), done.stderr[-2000:]


def test_a_reading_command_on_a_local_endpoint_makes_no_table(tmp_path: Path) -> None:
    """With keys.dynamodb_endpoint set (a local DynamoDB-compatible server), `keys list`, `usage`
    and the other commands that add no key made the table, and a mistyped table name answered "no
    keys" from the empty one it left behind, as a mistyped SQLite path did before its store was
    made only by the commands that add keys. Now each meets no table and says so; `keys create`
    makes it, as on SQLite."""
    table = "keys-local-typo"
    config = tmp_path / "floodgate.toml"
    with running_moto() as endpoint:
        config.write_text(
            f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\n'
            f'[keys]\nbackend = "dynamodb"\ndynamodb_table = "{table}"\ndynamodb_endpoint = "{endpoint}"\n'
        )
        env = aws_env(AWS_DEFAULT_REGION=REGION)
        tables = aws_client("dynamodb", endpoint)
        for argv in (["keys", "list"], ["usage"], ["keys", "revoke", "key_0123456789ab"]):
            done = floodgate(config, argv, env)
            assert_said_in_one_line(done, f"'{table}'", "ResourceNotFound", "`floodgate keys create`")
            assert tables.list_tables()["TableNames"] == [], argv
        created = floodgate(config, ["keys", "create", "--user", "alice", "--tier", "free"], env)
        assert created.returncode == 0, created.stderr
        assert tables.list_tables()["TableNames"] == [table]
        listed = floodgate(config, ["keys", "list"], env)
        assert listed.returncode == 0 and "alice" in listed.stdout, listed.stderr
