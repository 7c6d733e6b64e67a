"""`floodgate keys …`, `floodgate usage` as an operator runs them, on the store the settings name."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import pty
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge import sqlite_file
from edge.cli import main
from edge.config import ConfigError, load_settings
from edge.keys import sqlite as keys_sqlite
from edge.keys.authenticator import Authenticator
from edge.keys.legacy import read_keys_file
from edge.keys.record import MAX_USER_BYTES, KeyRecord, hash_key, key_id
from edge.keys.sqlite import SQLiteKeyStore
from edge.usage.record import Usage
from edge.usage.sqlite import SQLiteUsageStore
from edge.usage.store import WriteId
from tests.keys.conftest import SAME_ID, next_secrets
from tests.support.ascii_locale import ascii_locale_env


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "floodgate.toml"
    path.write_text(
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\n[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n'
    )
    return path


def run(capsys: pytest.CaptureFixture[str], config: Path, *argv: str) -> str:
    assert main([*argv, "--config", str(config)]) == 0
    out: str = capsys.readouterr().out
    return out


def user_of(config: Path, key: str) -> str | None:
    """Who the key authenticates as right now (None: refused), read from the store as an edge would."""

    async def check() -> str | None:
        store = SQLiteKeyStore(load_settings(config).keys.sqlite_path)
        try:
            return (await Authenticator(store, 1e-9).authenticate(f"Bearer {key}")).user
        except Exception:
            return None
        finally:
            await store.aclose()

    return asyncio.run(check())


def test_create_list_revoke(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    key = run(capsys, config, "keys", "create", "--user", "carol", "--tier", "free", "--label", "ci").strip()
    assert key.startswith("fg-") and user_of(config, key) == "carol"

    table = run(capsys, config, "keys", "list")
    assert key not in table and hash_key(key) not in table
    assert "carol" in table and f"…{key[-4:]}" in table and "active" in table

    [listed] = json.loads(run(capsys, config, "keys", "list", "--json", "--user", "carol"))
    assert set(listed) == {
        "id",
        "user",
        "tier",
        "label",
        "last4",
        "created",
        "expires",
        "revoked",
        "status",
        "replaced_by",
    }
    run(capsys, config, "keys", "revoke", listed["id"])
    assert user_of(config, key) is None
    assert "revoked" in run(capsys, config, "keys", "list")


def test_rotate_and_set_tier(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    old = run(capsys, config, "keys", "create", "--user", "dan", "--tier", "free").strip()
    [record] = json.loads(run(capsys, config, "keys", "list", "--json"))
    new = run(capsys, config, "keys", "rotate", record["id"], "--grace-s", "3600").strip()
    assert new != old and user_of(config, old) == user_of(config, new) == "dan"

    run(capsys, config, "keys", "set-tier", record["id"], "paid")
    tiers = {k["id"]: k["tier"] for k in json.loads(run(capsys, config, "keys", "list", "--json"))}
    assert tiers[record["id"]] == "paid"


def test_unknown_tier_empty_user_unknown_key_and_bad_periods_are_refused(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    with pytest.raises(SystemExit, match="unknown tier"):
        main(["keys", "create", "--user", "x", "--tier", "platinum", "--config", str(config)])
    with pytest.raises(SystemExit, match="no key key_nope"):
        main(["keys", "revoke", "key_nope", "--config", str(config)])
    # A nameless user would pool every such key's limits and usage (and named no Cluster slot).
    for user in ("", "  "):
        with pytest.raises(SystemExit, match="user must not be empty"):
            main(["keys", "create", "--user", user, "--tier", "free", "--config", str(config)])
    with pytest.raises(SystemExit, match="--expires-in-days must be a positive number of days"):
        main(
            [
                "keys",
                "create",
                "--user",
                "x",
                "--tier",
                "free",
                "--expires-in-days",
                "-1",
                "--config",
                str(config),
            ]
        )
    assert json.loads(run(capsys, config, "keys", "list", "--json")) == []
    run(capsys, config, "keys", "create", "--user", "x", "--tier", "free")
    [record] = json.loads(run(capsys, config, "keys", "list", "--json"))
    with pytest.raises(SystemExit, match="--grace-s must be 0 or a positive number of seconds"):
        main(["keys", "rotate", record["id"], "--grace-s", "-5", "--config", str(config)])
    run(capsys, config, "keys", "revoke", record["id"])
    with pytest.raises(SystemExit, match=f"key {record['id']} is revoked: only an active key can be rotated"):
        main(["keys", "rotate", record["id"], "--config", str(config)])


def test_a_far_expiry_is_refused(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    """A review: `--expires-in-days 1e8` (or the admin API's expires_in_s 1e12) was accepted, and
    `keys list` then failed for every key, for good (OSError/OverflowError in the table's times)."""
    for days, said in (("1e8", r"1e\+08"), ("-5", "-5"), ("0", "0"), ("nan", "nan")):
        # In days, as asked: it said "expires_in_s ... not -432000" for -5 days.
        with pytest.raises(SystemExit, match=rf"--expires-in-days must be .* \(100 years\), not {said}$"):
            run(capsys, config, "keys", "create", "--user", "x", "--tier", "free", "--expires-in-days", days)
    assert not Path(load_settings(config).keys.sqlite_path).exists()  # refused before the store opened


def test_a_rotation_grace_out_of_range_is_said_as_the_flag_typed(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """It said "grace_s must be ...", the admin API's field, for the `--grace-s` the operator typed."""
    run(capsys, config, "keys", "create", "--user", "x", "--tier", "free")
    [record] = json.loads(run(capsys, config, "keys", "list", "--json"))
    for grace, said in (("-1", "-1"), ("1e10", r"1e\+10"), ("nan", "nan")):
        with pytest.raises(SystemExit, match=rf"^floodgate: --grace-s must be .* \(100 years\), not {said}$"):
            main(["keys", "rotate", record["id"], "--grace-s", grace, "--config", str(config)])
    assert [k["status"] for k in json.loads(run(capsys, config, "keys", "list", "--json"))] == ["active"]


def test_a_far_expiry_a_store_holds_is_listed(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    """What a store written before the cap may hold (1e300 fits a SQLite REAL) is shown as its Unix
    seconds; the other keys are listed as ever."""

    async def seed() -> None:
        store = SQLiteKeyStore(load_settings(config).keys.sqlite_path)
        for n, expires in enumerate((1e17, 1e300, -1e17)):
            digest = hash_key(f"fg-stored-long-ago-{n}")
            await store.add(KeyRecord(key_id(digest), digest, "old", "free", created=1.0, expires=expires))
        await store.aclose()

    asyncio.run(seed())
    run(capsys, config, "keys", "create", "--user", "new", "--tier", "free")
    table = run(capsys, config, "keys", "list").splitlines()
    # Listed in id order (the order a page is read in), not the order stored.
    rows = table[1:]
    assert len(rows) == 4 and any("1e+300 (Unix s)" in row and " old " in row for row in rows)
    assert sum(" new " in row for row in rows) == 1


def test_a_second_rotate_is_refused_and_the_list_shows_the_replacement(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    run(capsys, config, "keys", "create", "--user", "eve", "--tier", "free")
    [record] = json.loads(run(capsys, config, "keys", "list", "--json"))
    new = run(capsys, config, "keys", "rotate", record["id"]).strip()
    new_id = key_id(hash_key(new))
    refusal = f"key {record['id']} was already rotated: its replacement is {new_id}"
    with pytest.raises(SystemExit, match=refusal):
        run(capsys, config, "keys", "rotate", record["id"])
    [old_row] = [line for line in run(capsys, config, "keys", "list").splitlines() if record["id"] in line]
    assert old_row.split()[-1] == new_id


def test_a_store_that_refuses_every_fresh_key_is_said_not_a_traceback(
    capsys: pytest.CaptureFixture[str], config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: create and rotate, after NEW_KEY_TRIES fresh keys refused (ids taken), ended in a
    RuntimeError's traceback. Here every key drawn after the first has the first one's id."""
    first, second = SAME_ID
    next_secrets(monkeypatch, first, *[second] * 8)
    run(capsys, config, "keys", "create", "--user", "lea", "--tier", "free")
    [record] = json.loads(run(capsys, config, "keys", "list", "--json"))
    for argv in (["create", "--user", "max", "--tier", "free"], ["rotate", record["id"]]):
        with pytest.raises(SystemExit, match=r"^floodgate: .*refused .* fresh keys.*try again"):
            main(["keys", *argv, "--config", str(config)])


def test_a_rotation_grace_past_100_years_is_a_settings_error(tmp_path: Path) -> None:
    path = tmp_path / "floodgate.toml"
    path.write_text("[keys]\nrotation_grace_s = 1e12\n")
    with pytest.raises(ConfigError, match=r"keys\.rotation_grace_s"):
        load_settings(path)


def test_import_of_the_old_keys_file_is_one_command_and_idempotent(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    old_key = "fg-a-key-from-the-old-keys-file"
    jsonl = tmp_path / "exported.jsonl"
    jsonl.write_text(json.dumps({"key_sha256": hash_key(old_key), "user": "erin", "tier": "paid"}) + "\n")
    run(capsys, config, "keys", "import", str(jsonl))
    assert user_of(config, old_key) == "erin"
    assert main(["keys", "import", str(jsonl), "--config", str(config)]) == 0
    assert "imported 0 keys; 1 were already in the store" in capsys.readouterr().err


def test_a_dev_key_in_the_old_keys_file_keeps_working(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """What `make serve` printed before the store existed sits in .floodgate/keys.jsonl: every key
    command and every edge start imports that file, so the key stays valid."""
    dev_key = "fg-the-dev-key-make-serve-printed-last-week"
    keys_file = Path(load_settings(config).server.keys_file)
    keys_file.write_text(json.dumps({"key_sha256": hash_key(dev_key), "user": "dev", "tier": "paid"}) + "\n")
    assert "dev" in run(capsys, config, "keys", "list")
    assert user_of(config, dev_key) == "dev"


def test_a_bad_line_in_the_configured_keys_file_is_said_naming_the_file(config: Path) -> None:
    """Every key command imports `[server] keys_file` first. A line in it that is no key (since
    49379f1 also a key_sha256 that is no hex, which imported before) made every command, `keys
    list` included, end in a BadKeysFile traceback that did not name the file."""
    keys_file = Path(load_settings(config).server.keys_file)
    keys_file.write_text(json.dumps({"key_sha256": " " + "a" * 63, "user": "dev", "tier": "paid"}) + "\n")
    for argv in (["list"], ["create", "--user", "x", "--tier", "free"]):
        with pytest.raises(SystemExit, match=rf"^floodgate: {keys_file}: line 1: key_sha256 is not"):
            main(["keys", *argv, "--config", str(config)])


def test_a_key_command_refuses_a_configured_keys_file_entry_in_an_unknown_tier(config: Path) -> None:
    """Every key command imports `[server] keys_file` first: a line in a tier the settings do not
    have was imported (its key then answered 403 unknown_tier to every request). Said instead,
    naming the file, the line and the tier; nothing of the file is imported."""
    keys_file = Path(load_settings(config).server.keys_file)
    keys_file.write_text(json.dumps({"key_sha256": hash_key("fg-k"), "user": "gus", "tier": "gold"}) + "\n")
    for argv in (["list"], ["create", "--user", "x", "--tier", "free"]):
        with pytest.raises(
            SystemExit, match=rf"^floodgate: {keys_file}: line 1: unknown tier 'gold'; configured: "
        ):
            main(["keys", *argv, "--config", str(config)])
    assert user_of(config, "fg-k") is None


def test_usage_as_a_table_and_as_csv(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    async def seed() -> None:
        store = SQLiteUsageStore(load_settings(config).keys.sqlite_path)
        await store.add(Usage("ann", "m", "2026-01-01", 12, 30, 2, 8), WriteId("seed", 1))
        await store.add(Usage("bo", "m", "2026-01-02", 5, 7, 1), WriteId("seed", 2))
        await store.aclose()

    asyncio.run(seed())
    rows = list(csv.DictReader(io.StringIO(run(capsys, config, "usage", "--csv"))))
    assert rows == [
        {
            "user": "ann",
            "model": "m",
            "date": "2026-01-01",
            "input_tokens": "12",
            "input_cached_tokens": "8",
            "output_tokens": "30",
            "requests": "2",
        },
        {
            "user": "bo",
            "model": "m",
            "date": "2026-01-02",
            "input_tokens": "5",
            "input_cached_tokens": "0",
            "output_tokens": "7",
            "requests": "1",
        },
    ]
    table = run(capsys, config, "usage", "--user", "bo")
    assert "bo" in table and "ann" not in table and "input_tokens" in table and "input_cached_tokens" in table
    for bound, day in (("--start", "bad"), ("--end", "2026-13-01")):
        # No such day: a usage error (exit 2) naming it, not an empty table that looks like none used.
        with pytest.raises(SystemExit) as refused:
            main(["usage", bound, day, "--config", str(config)])
        assert refused.value.code == 2
        assert f"must be a date like 2026-01-31, not '{day}'" in capsys.readouterr().err


def floodgate_under_ascii_locale(config: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """`floodgate` in a subprocess under a C locale without Python's UTF-8 coercion (stdout ASCII),
    this checkout's code; the arguments as a UTF-8 terminal passes them, as bytes."""
    env = ascii_locale_env()
    command = [sys.executable.encode(), b"-m", b"edge.cli", *(word.encode() for word in argv)]
    return subprocess.run(
        [*command, b"--config", str(config).encode()], capture_output=True, timeout=60, env=env
    )


def test_usage_as_csv_is_utf_8_under_an_ascii_locale(config: Path) -> None:
    """CSV is data: under a C locale without Python's UTF-8 coercion, `floodgate usage --csv` ended
    in a UnicodeEncodeError traceback at the first user or model named beyond ASCII, the rows
    before it half written. It is written as UTF-8 whatever the locale, every name as stored."""

    async def seed() -> None:
        store = SQLiteUsageStore(load_settings(config).keys.sqlite_path)
        await store.add(
            Usage("zo\u00eb", "mod\u00e8le-\U0001f600", "2026-01-01", 12, 30, 2), WriteId("seed", 1)
        )
        await store.aclose()

    asyncio.run(seed())
    done = floodgate_under_ascii_locale(config, "usage", "--csv")
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    (row,) = csv.DictReader(io.StringIO(done.stdout.decode("utf-8")))
    assert (row["user"], row["model"], row["requests"]) == ("zo\u00eb", "mod\u00e8le-\U0001f600", "2")


def test_a_user_named_beyond_ascii_is_created_and_found_under_an_ascii_locale(config: Path) -> None:
    """Under a C locale without Python's UTF-8 coercion the arguments reach Python as lone
    surrogates: `keys create --user zo\u00eb` ended in a UnicodeEncodeError traceback from the key
    store, and `keys list --user` / `usage --user` alike. They are taken as the terminal typed them."""
    created = floodgate_under_ascii_locale(
        config, "keys", "create", "--user", "zo\u00eb", "--tier", "free", "--label", "caf\u00e9"
    )
    assert created.returncode == 0, created.stderr.decode(errors="replace")[-2000:]
    key = created.stdout.decode().strip()

    async def stored() -> KeyRecord | None:
        store = SQLiteKeyStore(load_settings(config).keys.sqlite_path)
        try:
            return await store.get(hash_key(key))
        finally:
            await store.aclose()

    record = asyncio.run(stored())
    assert record is not None and (record.user, record.label) == ("zo\u00eb", "caf\u00e9"), record
    listed = floodgate_under_ascii_locale(config, "keys", "list", "--user", "zo\u00eb", "--json")
    assert listed.returncode == 0, listed.stderr.decode(errors="replace")[-2000:]
    assert [k["user"] for k in json.loads(listed.stdout)] == ["zo\u00eb"]
    usage = floodgate_under_ascii_locale(config, "usage", "--user", "zo\u00eb", "--csv")
    assert usage.returncode == 0, usage.stderr.decode(errors="replace")[-2000:]


def test_admin_key_prints_a_key_and_the_hash_to_configure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "admin-key"]) == 0
    captured = capsys.readouterr()
    key = captured.out.strip()
    assert key.startswith("fgadmin-") and f'admin_key_sha256 = "{hash_key(key)}"' in captured.err


@pytest.mark.parametrize("what", ["missing", "directory", "binary"])
def test_import_of_a_file_it_cannot_read_says_so(config: Path, tmp_path: Path, what: str) -> None:
    """Each ended in a FileNotFoundError / IsADirectoryError / UnicodeDecodeError traceback."""
    path = tmp_path / "exported.jsonl"
    if what == "directory":
        path.mkdir()
    elif what == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SystemExit, match=rf"^floodgate: cannot read {path}: "):
        main(["keys", "import", str(path), "--config", str(config)])


@pytest.mark.parametrize("where", ["under_a_file", "a_directory"])
def test_a_key_store_file_that_cannot_be_opened_is_said_naming_the_setting(
    config: Path, tmp_path: Path, where: str
) -> None:
    """An OSError (its directory under a file) or sqlite3.OperationalError (a directory) traceback.
    A path under a file is no store a reading command finds: `keys create` is the one to open it."""
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "keys.db" if where == "under_a_file" else tmp_path
    config.write_text(config.read_text().replace(str(tmp_path / "keys.db"), str(path)))
    readers = [["keys", "list"], ["usage"]] if where == "a_directory" else []
    for argv in [["keys", "create", "--user", "x", "--tier", "free"], *readers]:
        with pytest.raises(SystemExit, match=rf"^floodgate: keys\.sqlite_path '{path}': cannot open it: "):
            main([*argv, "--config", str(config)])


@pytest.mark.parametrize(
    "argv",
    [
        ["keys", "list"],
        ["keys", "revoke", "key_0123456789ab"],
        ["keys", "rotate", "key_0123456789ab"],
        ["keys", "set-tier", "key_0123456789ab", "paid"],
        ["usage"],
    ],
)
def test_a_command_on_a_key_store_that_does_not_exist_says_so_and_makes_none(
    config: Path, tmp_path: Path, argv: list[str]
) -> None:
    """A mistyped keys.sqlite_path made an empty store there and answered from it: "no keys", "no
    key key_…", an empty usage table, as if the operator's keys were gone, and left the file."""
    command = [sys.executable, "-m", "edge.cli", *argv, "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, ""), (done.returncode, done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"floodgate: keys.sqlite_path '{tmp_path / 'keys.db'}': no key store there (no such file); "
        "`floodgate keys create` or `floodgate serve` makes one"
    ], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["floodgate.toml"]


def test_keys_create_and_import_make_the_store_they_add_to(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    key = run(capsys, config, "keys", "create", "--user", "fay", "--tier", "free").strip()
    assert user_of(config, key) == "fay"
    elsewhere = tmp_path / "new" / "keys.db"
    config.write_text(config.read_text().replace(str(tmp_path / "keys.db"), str(elsewhere)))
    jsonl = tmp_path / "exported.jsonl"
    line = {"key_sha256": hash_key("fg-imported"), "user": "gus", "tier": "paid"}
    jsonl.write_text(json.dumps(line) + "\n")
    run(capsys, config, "keys", "import", str(jsonl))
    assert user_of(config, "fg-imported") == "gus"


@pytest.mark.parametrize("path", [":memory:", ""])
def test_a_key_store_in_memory_is_refused_by_the_cli_and_serve(tmp_path: Path, path: str) -> None:
    """keys.sqlite_path = ":memory:" (or "", SQLite's private temporary database) is a store each
    process, each connection even, has alone: `keys create` printed a key stored nowhere, and
    `serve` a dev key its edge never saw. Refused as the settings load, naming the setting."""
    config = tmp_path / "floodgate.toml"
    config.write_text(f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\n[keys]\nsqlite_path = "{path}"\n')
    for argv in (["keys", "create", "--user", "x", "--tier", "free"], ["serve", "--port", "0"]):
        command = [sys.executable, "-m", "edge.cli", *argv, "--config", str(config)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert (done.returncode, done.stdout) == (1, ""), (argv, done.returncode, done.stdout, done.stderr)
        [said] = done.stderr.splitlines()
        assert said.startswith("floodgate: invalid settings: ") and "keys.sqlite_path" in said, said
        assert "must name a file" in said, said


@pytest.mark.parametrize(
    ("section", "argv"),
    [
        ("keys", ["keys", "list"]),
        ("keys", ["keys", "create", "--user", "x", "--tier", "free"]),
        ("messages", ["serve", "--port", "0"]),
    ],
)
def test_a_dynamodb_endpoint_without_its_scheme_is_said_naming_the_setting(
    tmp_path: Path, section: str, argv: list[str]
) -> None:
    """`dynamodb_endpoint = "dynamo.internal:8000"` (the scheme left out, as a local DynamoDB's address is
    often written) loaded, and botocore's ValueError "Invalid endpoint" was a traceback from `serve`
    and from every `floodgate keys` command. Refused as the settings load, naming the setting and
    not repeating its value."""
    stores = {name: f'sqlite_path = "{tmp_path / name}.db"\n' for name in ("keys", "messages")}
    endpoint = 'dynamodb_endpoint = "dynamo.internal:8000"\n'
    stores[section] = f'backend = "dynamodb"\ndynamodb_table = "floodgate-{section}"\n{endpoint}'
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nport = 0\nops_port = 0\n'
        + "".join(f"[{name}]\n{table}" for name, table in stores.items())
    )
    env = {
        **os.environ,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    command = [sys.executable, "-m", "edge.cli", *argv, "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert (done.returncode, done.stdout) == (1, ""), (argv, done.returncode, done.stdout, done.stderr)
    [said] = done.stderr.splitlines()
    assert said.startswith(f"floodgate: invalid settings: {config}: {section}.dynamodb_endpoint "), said
    assert "dynamo.internal" not in said, said


@pytest.fixture
def read_only_keys_db(tmp_path: Path) -> Iterator[Path]:
    """A key store file that can be read but not written (made immutable: the tests run as root,
    whom no file mode stops; an edge's user meets it as a file another account owns)."""
    path = tmp_path / "keys.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("NOT RUN: chattr +i is not available here (needs root and a file system that has it)")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_key_store_file_it_may_not_write_is_said_naming_the_setting(
    config: Path, read_only_keys_db: Path
) -> None:
    """It opens for reading, so the check passed it, and the store's own open raised
    sqlite3.OperationalError ("attempt to write a readonly database") as a traceback."""
    said = rf"^floodgate: keys\.sqlite_path '{read_only_keys_db}': cannot open it: .*readonly"
    for argv in (["keys", "list"], ["usage"]):
        with pytest.raises(SystemExit, match=said):
            main([*argv, "--config", str(config)])


def test_import_of_standard_input_it_cannot_read_says_so(config: Path) -> None:
    """`floodgate keys import - < exported` of a binary file (not UTF-8): a Unicode error traceback,
    where the same file named as PATH is said in one line."""
    command = [sys.executable, "-m", "edge.cli", "keys", "import", "-", "--config", str(config)]
    done = subprocess.run(command, input=b"\xff\xfe\x00garbage", capture_output=True, timeout=60)
    stderr = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith("floodgate: cannot read standard input: "), stderr


def _import_refused(config: Path, tmp_path: Path, lines: list[dict[str, object]]) -> str:
    """The import's refusal, once it is seen to have written nothing."""
    jsonl = tmp_path / "exported.jsonl"
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(SystemExit) as refused:
        main(["keys", "import", str(jsonl), "--config", str(config)])
    store = SQLiteKeyStore(load_settings(config).keys.sqlite_path)
    try:
        assert asyncio.run(store.list_keys()) == []
    finally:
        asyncio.run(store.aclose())
    return str(refused.value)


def test_import_refuses_a_user_name_too_long_for_the_stores(config: Path, tmp_path: Path) -> None:
    """`keys create` and the admin API refuse a user past MAX_USER_BYTES: on DynamoDB every usage
    row and message of such a user is refused, so they are served unmetered and keep no history.
    The keys file took any name."""
    lines = [
        {"key_sha256": hash_key("fg-a"), "user": "ann", "tier": "free"},
        {"key_sha256": hash_key("fg-b"), "user": "é" * (MAX_USER_BYTES // 2 + 1), "tier": "free"},
    ]
    said = _import_refused(config, tmp_path, lines)
    assert f"line 2: user must be at most {MAX_USER_BYTES} bytes" in said


def test_import_refuses_one_key_given_twice_as_two_users(config: Path, tmp_path: Path) -> None:
    """A keys file that names one key twice (its hash in either case) with another user or tier
    was imported as the first line said and counted the second 'already in the store': the
    operator was never told which user the key now bills."""
    digest = hash_key("fg-shared")
    lines = [
        {"key_sha256": digest, "user": "ann", "tier": "free"},
        {"key_sha256": hash_key("fg-other"), "user": "bob", "tier": "free"},
        {"key_sha256": digest.upper(), "user": "cid", "tier": "free"},
    ]
    assert "line 3: key_sha256 is line 1's, with another user or tier" in _import_refused(
        config, tmp_path, lines
    )


def test_import_takes_a_line_repeated_as_one_key(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    line = json.dumps({"key_sha256": hash_key("fg-twice"), "user": "ann", "tier": "free"})
    jsonl = tmp_path / "exported.jsonl"
    jsonl.write_text(f"{line}\n{line}\n")
    assert main(["keys", "import", str(jsonl), "--config", str(config)]) == 0
    assert "imported 1 keys; 0 were already in the store" in capsys.readouterr().err
    assert user_of(config, "fg-twice") == "ann"


def test_a_label_past_what_the_stores_hold_is_said(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    with pytest.raises(
        SystemExit, match=r"^floodgate: label must be at most 1024 bytes \(UTF-8\), not 2000$"
    ):
        main(
            [
                "keys",
                "create",
                "--user",
                "x",
                "--tier",
                "free",
                "--label",
                "l" * 2000,
                "--config",
                str(config),
            ]
        )
    assert json.loads(run(capsys, config, "keys", "list", "--json")) == []


def test_import_refuses_a_tier_the_settings_do_not_have(config: Path, tmp_path: Path) -> None:
    """`keys create` refuses an unknown tier; `keys import` said 'imported 1 keys', and every
    request of that key was then a 403 (its tier not configured)."""
    lines = [
        {"key_sha256": hash_key("fg-a"), "user": "ann", "tier": "free"},
        {"key_sha256": hash_key("fg-b"), "user": "bob", "tier": "platinum"},
    ]
    said = _import_refused(config, tmp_path, lines)
    assert "line 2: unknown tier 'platinum'; configured: " in said


def test_a_label_with_control_characters_is_refused_and_a_stored_one_listed_escaped(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """A label's newline drew a row of its own in `keys list` (a key that does not exist) and its
    escape sequences reached the operator's terminal. Refused now; one a store holds from before
    is listed with them escaped, one key one line."""
    with pytest.raises(SystemExit, match=r"^floodgate: label must not contain control characters"):
        main(["keys", "create", "--user", "x", "--tier", "free", "--label", "a\nb", "--config", str(config)])

    async def seed() -> None:
        store = SQLiteKeyStore(load_settings(config).keys.sqlite_path)
        digest = hash_key("fg-stored-before")
        label = "ci\nkey_000000000000  victim  paid\x1b[31m"
        await store.add(KeyRecord(key_id(digest), digest, "old\r", "free", label=label, created=1.0))
        await store.aclose()

    asyncio.run(seed())
    table = run(capsys, config, "keys", "list")
    lines = table.splitlines()
    assert len(lines) == 2, table
    assert "\x1b" not in table and "\r" not in table
    assert r"ci\nkey_000000000000  victim  paid\x1b[31m" in lines[1] and r"old\r" in lines[1]
    # --json is JSON's own escaping: the label as stored.
    [view] = json.loads(run(capsys, config, "keys", "list", "--json"))
    assert view["label"] == "ci\nkey_000000000000  victim  paid\x1b[31m"


def test_a_label_or_user_with_format_characters_is_refused_and_a_stored_one_listed_escaped(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """A review: a right-to-left override or a zero-width character (Unicode category Cf) in a
    label or user was taken, and `keys list` then showed one key as another's. Refused, naming the
    character; one a store holds from before is listed with it escaped."""
    for option, value in (("--label", "ci-\u202eyek"), ("--user", "alice\u200d")):
        argv = ["keys", "create", "--user", "x", "--tier", "free", option, value, "--config", str(config)]
        with pytest.raises(SystemExit, match=r"^floodgate: (label|user) must not contain .*U\+20"):
            main(argv)
    assert json.loads(run(capsys, config, "keys", "list", "--json")) == []

    async def seed() -> None:
        store = SQLiteKeyStore(load_settings(config).keys.sqlite_path)
        digest = hash_key("fg-stored-before-cf")
        await store.add(
            KeyRecord(key_id(digest), digest, "bob\u200b", "free", label="ci-\u202eyek", created=1.0)
        )
        await store.aclose()

    asyncio.run(seed())
    table = run(capsys, config, "keys", "list")
    assert "\u202e" not in table and "\u200b" not in table
    assert r"ci-\u202eyek" in table and r"bob\u200b" in table


def test_set_tier_of_a_revoked_key_is_refused(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    """A review: `keys set-tier` of a revoked key said it "is now on tier 'paid'" and exited 0."""
    run(capsys, config, "keys", "create", "--user", "pat", "--tier", "free")
    [record] = json.loads(run(capsys, config, "keys", "list", "--json"))
    run(capsys, config, "keys", "revoke", record["id"])
    with pytest.raises(
        SystemExit, match=rf"^floodgate: key {record['id']} is revoked: only an active key can be moved"
    ):
        main(["keys", "set-tier", record["id"], "paid", "--config", str(config)])
    [after] = json.loads(run(capsys, config, "keys", "list", "--json"))
    assert after["tier"] == "free"


def test_list_pages_through_every_key_unless_given_a_limit(
    capsys: pytest.CaptureFixture[str], config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge import keys_cli

    for _ in range(5):
        run(capsys, config, "keys", "create", "--user", "pat", "--tier", "free")
    # Pages of 2: five keys take three reads, and every key is listed.
    monkeypatch.setattr(keys_cli, "PAGE_SIZE", 2)
    everything = json.loads(run(capsys, config, "keys", "list", "--json"))
    ids = [k["id"] for k in everything]
    assert len(ids) == 5 and ids == sorted(ids)

    assert main(["keys", "list", "--json", "--limit", "3", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert [k["id"] for k in json.loads(out)] == ids[:3]
    assert f"--after {ids[2]}" in err  # where the next page starts
    rest = json.loads(run(capsys, config, "keys", "list", "--json", "--after", ids[2]))
    assert [k["id"] for k in rest] == ids[3:]
    with pytest.raises(SystemExit) as refused:
        main(["keys", "list", "--limit", "0", "--config", str(config)])
    assert refused.value.code != 0


def test_a_keys_file_user_with_a_format_character_still_starts_and_is_listed_escaped(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """The keys file is another system's keys, its users already in use (their usage, limits and
    conversations keyed by them): a Persian user id with a zero-width non-joiner imported before
    41e6c3b. Refused since, as a key created here is, every key command and every edge start ended
    in BadKeysFile: an upgrade took the whole edge down for one such line. Taken, and listed with
    the character escaped, as a user stored before is."""
    key = "fg-a-legacy-key-of-a-persian-user"
    keys_file = Path(load_settings(config).server.keys_file)
    user = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"
    keys_file.write_text(json.dumps({"key_sha256": hash_key(key), "user": user, "tier": "paid"}) + "\n")
    assert [k.user for k in read_keys_file(str(keys_file), ["paid"])] == [
        user
    ]  # what `floodgate serve` reads first
    table = run(capsys, config, "keys", "list")
    assert "\u200c" not in table and r"\u200c" in table
    assert user_of(config, key) == user
    # A control character is still no user, from the keys file as from `keys create`.
    keys_file.write_text(json.dumps({"key_sha256": hash_key(key), "user": "a\nb", "tier": "paid"}) + "\n")
    with pytest.raises(SystemExit, match=r"line 1: user must not contain control characters"):
        main(["keys", "list", "--config", str(config)])


def test_revoking_a_rotations_new_key_says_the_old_one_it_revoked_too(
    capsys: pytest.CaptureFixture[str], config: Path
) -> None:
    """Since 64e4b2b a revoke of a rotation's new key revokes the old key still in its grace, and
    the command said only "revoked <new>": the operator was not told that the key still in use
    (a deployment not yet moved to the new one) stopped working too."""
    old = run(capsys, config, "keys", "create", "--user", "olga", "--tier", "free").strip()
    old_id = key_id(hash_key(old))
    run(capsys, config, "keys", "rotate", old_id, "--grace-s", "3600")
    # Listed in id order (42a8636): the new key is the one that is not the old.
    [new] = [
        k
        for k in json.loads(run(capsys, config, "keys", "list", "--json", "--user", "olga"))
        if k["id"] != old_id
    ]
    assert main(["keys", "revoke", new["id"], "--config", str(config)]) == 0
    said = capsys.readouterr().err
    assert f"revoked {new['id']}" in said and f"also revoked {old_id}" in said
    assert user_of(config, old) is None


@pytest.mark.parametrize("user", ["", "  "])
def test_list_refuses_an_empty_user(capsys: pytest.CaptureFixture[str], config: Path, user: str) -> None:
    """No key has an empty user (keys create refuses one), and on DynamoDB the index query for one
    is refused: `keys list --user ''` ended in the store's error there, and listed nothing here."""
    with pytest.raises(SystemExit, match="--user must not be empty"):
        main(["keys", "list", "--user", user, "--config", str(config)])
    # `usage --user ''` listed nothing, quietly: the same refusal.
    with pytest.raises(SystemExit, match="--user must not be empty"):
        main(["usage", "--user", user, "--config", str(config)])


def test_usage_refuses_a_start_after_its_end(config: Path) -> None:
    """`usage --start 2026-01-31 --end 2026-01-01` (the two swapped) printed an empty table, exit 0,
    which reads as no one having used anything: a usage error naming both days, as a day that does
    not exist is."""
    days = ["--start", "2026-01-31", "--end", "2026-01-01"]
    done = subprocess.run(
        [sys.executable, "-m", "edge.cli", "usage", *days, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [
        "floodgate usage: error: --start 2026-01-31 is after --end 2026-01-01"
    ], done.stderr


@pytest.fixture
def write_locked_keys_db(config: Path) -> Iterator[Path]:
    """The key store with its write lock held by another connection for the whole command (a
    `sqlite3` shell left in a transaction, a backup tool): the store's own open waits its 10 s."""
    path = Path(load_settings(config).keys.sqlite_path)
    asyncio.run(SQLiteKeyStore(path).aclose())
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("BEGIN EXCLUSIVE")
        yield path


def test_a_key_store_locked_past_its_wait_is_said_naming_the_setting(
    capsys: pytest.CaptureFixture[str],
    config: Path,
    write_locked_keys_db: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sqlite3.OperationalError ("database is locked") was a traceback once the store had waited
    out its busy timeout: from `keys create`'s write, and from `usage`, whose store writes as it
    opens. Both go through the same handler (edge/keys/cli_support.py run); one is checked. The
    waits are cut short (15 s as shipped: the open check's 5, then the store's 10): what is
    asserted is what is said once they are over."""
    monkeypatch.setattr(sqlite_file, "OPEN_CHECK_WAIT_S", 0.1)
    monkeypatch.setattr(keys_sqlite, "BUSY_WAIT_S", 0.1)
    said = rf"^floodgate: keys\.sqlite_path '{write_locked_keys_db}': database is locked"
    with pytest.raises(SystemExit, match=said):
        main(["keys", "create", "--user", "x", "--tier", "free", "--config", str(config)])
    assert capsys.readouterr().out == ""


def test_import_with_no_file_at_a_terminal_is_a_usage_error(config: Path) -> None:
    """`floodgate keys import` with no file, run at a terminal, read standard input: it sat waiting
    without a word, as if hung. A usage error now (2), naming the way to type the keys in (-)."""
    controller, terminal = pty.openpty()
    command = [sys.executable, "-m", "edge.cli", "keys", "import", "--config", str(config)]
    try:
        # The timeout only bounds a failure: an answer comes at once, a wait for input never ends.
        done = subprocess.run(command, stdin=terminal, capture_output=True, text=True, timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert "floodgate keys import: error: no file given, and standard input is a terminal" in done.stderr
    assert not Path(load_settings(config).keys.sqlite_path).exists()
