"""Settings that cannot work together are refused when they are loaded."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from edge.config import ConfigError, load_settings
from edge.float32 import FLOAT32_MIN_NORMAL
from edge.keys.record import hash_key
from gpu_container.engine.types import EngineConfig
from limiter.factory import create_limiter
from limiter.tiers import MAX_PERIOD_S
from tests.edge.conftest import ROOMY_TIERS
from tests.limiter.clock import ManualClock
from tests.limiter.tiers import tier
from tests.support.ascii_locale import ascii_locale_env
from tests.support.redis_server import start_redis


def test_the_defaults_load() -> None:
    settings = load_settings()
    assert settings.limiter.slot_ttl_s == 300
    assert settings.metrics.cloudwatch is False and settings.server.dev_key is True
    assert settings.messages.ttl_days == 90


def test_a_queue_wait_the_slot_ttl_does_not_cover_with_margin_is_refused() -> None:
    long_wait = {"tiers": {"paid": ROOMY_TIERS["paid"] | {"max_queue_wait_s": 250.0}}}
    with pytest.raises(ConfigError, match=r"tiers\.paid\.max_queue_wait_s = 250 s needs limiter\.slot_ttl_s"):
        load_settings(overrides=long_wait)
    settings = load_settings(overrides=long_wait | {"limiter": {"slot_ttl_s": 310}})
    assert settings.limiter.slot_ttl_s == 310


def test_instance_count_below_one_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="instance_count"):
        load_settings(overrides={"limiter": {"instance_count": 0}})


@pytest.mark.parametrize(
    "field", ["requests_per_window", "tokens_per_window", "token_window_s", "max_concurrent", "max_tokens"]
)
def test_a_tier_budget_of_zero_is_refused(field: str) -> None:
    """It divided every request's rates by zero: a 500 on each request instead of a settings error."""
    with pytest.raises(msgspec.ValidationError, match=field):
        load_settings(overrides={"tiers": {"free": {field: 0}}})


@pytest.mark.parametrize("field", ["request_window_s", "token_window_s", "history_read_window_s"])
def test_a_tier_window_under_a_millisecond_is_refused(field: str) -> None:
    """A window under half a microsecond is 0 in the limiter's whole microseconds: the settings
    loaded and every request was a 500 (ZeroDivisionError), with no reset header to give."""
    with pytest.raises(msgspec.ValidationError, match=field):
        load_settings(overrides={"tiers": {"free": {field: 1e-7}}})
    assert load_settings(overrides={"tiers": {"free": {field: 0.001}}}).tiers["free"].name == "free"


@pytest.mark.parametrize(
    ("table", "field", "value"),
    [
        ("server", "port", 70000),
        ("server", "port", -5),
        ("server", "ops_port", 65536),
        ("server", "max_body_bytes", 0),
        ("server", "keepalive_s", 0),
        ("limiter", "timeout_ms", 0),
        ("admission", "reserved_paid_fraction", 1.5),
        ("admission", "reserved_paid_fraction", -0.1),
        ("admission", "max_queue", -1),
        # Both loaded, and the admission queue refused them as the edge started: a ValueError's
        # traceback after the model's import, not a settings error.
        ("admission", "max_queue", 0),
        ("admission", "reserved_paid_fraction", 1.0),
        ("messages", "queue_size", 0),
        ("tiers.free", "max_queue_wait_s", -1),
    ],
)
def test_a_setting_out_of_its_range_is_refused_at_load(table: str, field: str, value: float) -> None:
    """Loaded, a port past 65535 reached the bind after the model's import and the dev key's
    creation and ended in an OverflowError's traceback; a keep-alive of 0 s sent its comments back
    to back; a body limit of 0 answered every request 413: settings errors, said at start."""
    overrides: dict[str, Any] = {field: value}
    for name in reversed(table.split(".")):
        overrides = {name: overrides}
    with pytest.raises(msgspec.ValidationError, match=field):
        load_settings(overrides=overrides)


def test_a_member_ttl_within_two_beats_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"member_ttl_s 1\.5 is under two beats"):
        load_settings(overrides={"fleet": {"heartbeat_s": 1.0, "member_ttl_s": 1.5}})
    assert (
        load_settings(overrides={"fleet": {"heartbeat_s": 1.0, "member_ttl_s": 2.0}}).fleet.member_ttl_s
        == 2.0
    )


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("messages", "ttl_days"),
        ("tiers.free", "request_window_s"),
        ("tiers.paid", "token_window_s"),
        ("fleet", "heartbeat_s"),
        ("fleet", "member_ttl_s"),
        ("keys", "cache_ttl_s"),
        ("server", "drain_deadline_s"),
        ("server", "keepalive_s"),
        ("metrics", "decode_s_per_token"),
        ("engine", "prefill_slowdown"),
        ("models.floodgate-demo", "token_weight"),
    ],
)
def test_an_infinite_setting_is_refused_at_load(table: str, field: str) -> None:
    """TOML writes inf and a range's lower bound let it through. Loaded, messages.ttl_days = inf
    was an OverflowError at start (its seconds rounded to an int), a tier's window one at the first
    request of that tier, fleet.heartbeat_s = inf a membership that refused to start."""
    overrides: dict[str, Any] = {field: math.inf}
    if table == "fleet":
        overrides = {"heartbeat_s": math.inf, "member_ttl_s": math.inf}
    for name in reversed(table.split(".")):
        overrides = {name: overrides}
    if table == "engine":
        # Refused by EngineConfig itself, which the Triton CPU model's parameters also decode to.
        with pytest.raises(msgspec.ValidationError, match=rf"{field} \(inf\) must be a finite number"):
            load_settings(overrides=overrides)
        return
    if table in ("tiers.free", "tiers.paid", "fleet"):
        # Refused by their upper bound, 100 years (test_a_duration_past_a_hundred_years_...).
        with pytest.raises(msgspec.ValidationError, match=rf"<= {MAX_PERIOD_S} - at `\$\.{table}\.\w+`"):
            load_settings(overrides=overrides)
        return
    with pytest.raises(ConfigError, match=rf"{table}\.\w+ = inf: a setting must be a finite number"):
        load_settings(overrides=overrides)


def test_an_infinite_setting_in_the_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "inf.toml"
    config.write_text("[messages]\nttl_days = inf\n")
    with pytest.raises(ConfigError, match=r"messages\.ttl_days = inf"):
        load_settings(config)


@pytest.mark.parametrize("slowdown", [0.5, 1.0])
def test_a_prefill_slowdown_not_above_one_is_refused(slowdown: float) -> None:
    """It loaded, and the engine's start (calibrating its time budget) raised ValueError."""
    with pytest.raises(msgspec.ValidationError, match="prefill_slowdown"):
        load_settings(overrides={"engine": {"prefill_slowdown": slowdown}})
    assert load_settings(overrides={"engine": {"prefill_slowdown": 0.0}}).engine.prefill_slowdown == 0.0


def test_serve_exits_with_the_reason_on_bad_settings(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[limiter]\nslot_ttl_s = 100\n")
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    assert "invalid settings" in done.stderr and "slot_ttl_s" in done.stderr


def test_serve_exits_with_the_reason_on_a_bad_keys_file(tmp_path: Path) -> None:
    """A line of [server] keys_file that is no key was a traceback from the dev key's hint (or from
    the app's start, without one), after the model's import."""
    (tmp_path / ".floodgate").mkdir()
    (tmp_path / ".floodgate" / "keys.jsonl").write_text('{"key_sha256": "zz", "user": "a", "tier": "free"}\n')
    command = [sys.executable, "-m", "edge.cli", "serve"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "floodgate: .floodgate/keys.jsonl: line 1: key_sha256 is not a SHA-256 hex digest"
    )


def test_serve_refuses_a_keys_file_entry_in_a_tier_the_settings_do_not_have(tmp_path: Path) -> None:
    """A keys_file line naming a tier not in [tiers] was imported without a word: the edge started,
    and each request of that key was a 403 unknown_tier. Refused at start now, naming the file,
    the line and the tier, never the key."""
    (tmp_path / ".floodgate").mkdir()
    line = {"key_sha256": hash_key("fg-a-key-in-a-tier-not-configured"), "user": "gus", "tier": "gold"}
    (tmp_path / ".floodgate" / "keys.jsonl").write_text(json.dumps(line) + "\n")
    command = [sys.executable, "-m", "edge.cli", "serve"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "floodgate: .floodgate/keys.jsonl: line 1: unknown tier 'gold'; configured: free, paid"
    )


def test_the_defaults_load_under_an_ascii_locale(tmp_path: Path) -> None:
    """defaults.toml holds non-ASCII comments (×, …) and was read in the locale's encoding: under
    a plain C locale without Python's UTF-8 coercion every command that loads settings ended in a
    UnicodeDecodeError traceback. TOML is UTF-8."""
    env = ascii_locale_env()
    code = (
        "import locale; from edge.config import load_settings; load_settings(); "
        "print(locale.getpreferredencoding(False))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().lower() in {"ascii", "ansi_x3.4-1968"}, done.stdout  # the case it covers


def test_the_operators_listings_print_under_an_ascii_locale(tmp_path: Path) -> None:
    """Under a C locale without Python's UTF-8 coercion stdout is ASCII: `floodgate keys list` ended
    in a UnicodeEncodeError traceback for any key (its last4 column starts with an ellipsis), and
    `floodgate config show` for any setting not ASCII (a model named in French), printed nothing.
    The listing says what the terminal cannot as "?"; the settings stay TOML that loads again."""
    env = ascii_locale_env()
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n[server]\nkeys_file = "{tmp_path / "k.jsonl"}"\n'
        '[model]\nname = "mod\u00e8le-\U0001f600"\n',
        encoding="utf-8",
    )

    def floodgate(*words: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "edge.cli", *words, "--config", str(config)]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path, encoding="utf-8"
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    key = floodgate("keys", "create", "--user", "alice", "--tier", "paid").stdout.strip()
    (listed,) = floodgate("keys", "list").stdout.splitlines()[1:]
    assert listed.split()[1:3] == ["alice", "paid"] and f"?{key[-4:]}" in listed, listed
    shown = tmp_path / "shown.toml"
    shown.write_text(floodgate("config", "show").stdout, encoding="utf-8")
    assert load_settings(shown).model.name == "mod\u00e8le-\U0001f600"


@pytest.mark.anyio
async def test_the_slot_ttl_reaches_the_limiter() -> None:
    clock = ManualClock()
    limiter = create_limiter("memory", "", 250, 1, clock=clock, lease_ttl_s=90)
    one_slot = tier(concurrent=1)
    assert (await limiter.admit("u", "a", one_slot, 1, 1)).decision.allowed  # never settled
    assert not (await limiter.admit("u", "b", one_slot, 1, 1)).decision.allowed
    clock.advance(90)
    assert (await limiter.admit("u", "c", one_slot, 1, 1)).decision.allowed


# Every engine field set away from its default: what the settings file says must reach the engine
# whichever path runs it (in-process here; the Triton CPU model in tests/triton/test_contract.py).
ENGINE_TABLE = {
    "block_size": 8,
    "num_blocks": 96,
    "max_num_seqs": 5,
    "max_num_batched_tokens": 96,
    "max_model_len": 512,
    "blas_threads": 2,
    "enable_prefix_caching": False,
    "prefill_slowdown": 2.5,
    "min_prefill_chunk": 7,
    "gemv_knee_rows": 3,
    "prefill_lane": "off",
    "lane_piece_tokens": 32,
    "batching": "static",
}


def test_every_engine_setting_reaches_the_engine_config() -> None:
    settings = load_settings(overrides={"engine": ENGINE_TABLE | {"replicas": 3, "isolation": "thread"}})
    assert settings.engine.engine_config() == EngineConfig(**ENGINE_TABLE)
    assert set(ENGINE_TABLE) == set(EngineConfig.__struct_fields__), "a new engine field needs a value here"


def test_engine_settings_are_checked_against_the_engines_bounds(tmp_path: Path) -> None:
    with pytest.raises(msgspec.ValidationError, match="min_prefill_chunk"):
        load_settings(overrides={"engine": {"min_prefill_chunk": 0}})
    config = tmp_path / "typo.toml"
    config.write_text("[engine]\nprefil_slowdown = 2.0\n")
    with pytest.raises(ConfigError, match=r"engine\.prefil_slowdown"):
        load_settings(config)


def test_settings_that_do_not_fit_together_name_the_file(tmp_path: Path) -> None:
    """Each setting was right alone, so the message named the setting but not the file it was in."""
    config = tmp_path / "tiers.toml"
    config.write_text('[tiers.free]\ndefault_model = "nope"\n')
    with pytest.raises(ConfigError, match=r"tiers\.toml: tiers\.free\.default_model 'nope'"):
        load_settings(config)


MALFORMED_SPECS = [
    "garbage",
    "host:http",
    "host:8000:8002:9",
    "a:8000,b",
    "asg:",
    "asg:g:http",
    "host:99999",
    "host:\u00b2",
]
DOCUMENTED_SPECS = ["", "local", "host:8000", "10.0.0.1:8000:8002, 10.0.0.2:8000", "asg:gpus:8000:8002"]


@pytest.mark.parametrize("spec", MALFORMED_SPECS)
@pytest.mark.parametrize("where", ["upstream", "models"])
def test_a_malformed_replica_spec_is_refused_at_load(tmp_path: Path, spec: str, where: str) -> None:
    """It loaded, and the app's start ended in a ValueError traceback from the upstream's build."""
    config = tmp_path / "triton.toml"
    if where == "upstream":
        config.write_text(f'[model]\nsource = "demo"\n[upstream]\ntriton = "{spec}"\n')
        setting = "upstream.triton"
    else:
        config.write_text(f'[models.a]\nsource = "demo"\ntriton = "{spec}"\n')
        setting = "models.a.triton"
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert str(config) in str(caught.value) and setting in str(caught.value)


@pytest.mark.parametrize("spec", DOCUMENTED_SPECS)
def test_every_documented_replica_spec_loads(spec: str) -> None:
    settings = load_settings(overrides={"upstream": {"triton": spec}, "models": {"a": {"source": "demo"}}})
    assert settings.upstream.triton == spec


def test_serve_with_a_malformed_triton_option_exits_with_the_reason(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "edge.cli", "serve", "--triton", "garbage"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "invalid settings" in done.stderr and "upstream.triton 'garbage'" in done.stderr


@pytest.mark.parametrize("url", ["127.0.0.1:6379", "http://127.0.0.1:6379/0", "redis://:hunter2@host:port/0"])
def test_a_redis_url_redis_py_cannot_read_is_refused_at_load(tmp_path: Path, url: str) -> None:
    """It loaded, and the app's start ended in redis-py's ValueError traceback."""
    config = tmp_path / "redis.toml"
    config.write_text(f'[limiter]\nbackend = "redis"\nredis_url = "{url}"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    message = str(caught.value)
    assert str(config) in message and "limiter.redis_url" in message
    assert "hunter2" not in message  # the error is printed: never the URL's password


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2@cache:6379/abc",
        "rediss://cache:6380/0/1",
        "redis://cache:6379/-1",
        "redis+cluster://:hunter2@cache:7000/db0",
    ],
)
def test_a_redis_url_whose_database_is_no_number_is_refused_at_load(tmp_path: Path, url: str) -> None:
    """redis-py reads a database that is no number as none given: `/abc` connected to database 0,
    quietly sharing it with whatever else uses 0 (`/0/1`, its slashes dropped, read as 1)."""
    config = tmp_path / "redis.toml"
    config.write_text(f'[limiter]\nbackend = "redis"\nredis_url = "{url}"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config)  # what `serve` and every command taking --config load first
    said = str(caught.value)
    assert said.startswith(f"{config}: limiter.redis_url: its database "), said
    assert "hunter2" not in said


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://127.0.0.1:6379/15",
        "redis://127.0.0.1:6379/",
        "rediss://:pw@host:6380",
        "redis+cluster://host:7000",
        "unix:///tmp/r.sock",
        "unix:///tmp/r.sock?db=2",
    ],
)
def test_every_redis_url_form_loads(url: str) -> None:
    settings = load_settings(overrides={"limiter": {"backend": "redis", "redis_url": url}})
    assert settings.limiter.redis_url == url


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_serve_refuses_fewer_than_one_worker(tmp_path: Path, workers: str) -> None:
    """`--workers 0` served one worker, as if it had been given 1."""
    command = [sys.executable, "-m", "edge.cli", "serve", "--workers", workers]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "--workers" in done.stderr and "at least 1" in done.stderr


def test_serve_with_a_messages_file_it_cannot_open_exits_with_the_reason(tmp_path: Path) -> None:
    """An OSError traceback from the app's start (exit 3), after the model's import."""
    (tmp_path / "file").write_text("")
    config = tmp_path / "floodgate.toml"
    config.write_text(f'[messages]\nsqlite_path = "{tmp_path / "file" / "messages.db"}"\n')
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "floodgate: messages.sqlite_path" in done.stderr and "cannot open it" in done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "rediss://:hunter2X#cd@cache:6379/0",  # a '#', '/' or '?' in a password not percent-encoded
        "rediss://default:hunter2X/cd@cache:6379/0",
        "redis://:hunter2X?cd@cache:6379",
        "redis://:hunter2X\uff03cd@cache:6379",  # a fullwidth '#': NFKC makes it one
    ],
)
def test_a_redis_url_refused_at_load_never_says_its_password(url: str) -> None:
    """Such a password ends the URL's authority early and is read as the port: redis-py's reason,
    "Port could not be cast to integer value as 'hunter2X'", printed the password (to the task's
    logs); Python's NFKC check quotes the whole authority."""
    with pytest.raises(ConfigError) as caught:
        load_settings(overrides={"limiter": {"backend": "redis", "redis_url": url}})
    message = str(caught.value)
    assert "limiter.redis_url" in message
    assert "hunter2X" not in message


@pytest.mark.parametrize("spec", ["gpu1 :8000", "gpu 1:8000", "[::1]:8000"])
def test_a_replica_host_no_connection_can_reach_is_refused_at_load(tmp_path: Path, spec: str) -> None:
    """A space inside the host (`gpu1 :8000`, a slip of the pen) loaded, and the replica was built
    on host 'gpu1 ', which no lookup resolves: never ready, every request answered 503, nothing
    said why. An IPv6 address, never read (its colons split it), is refused naming the form too."""
    config = tmp_path / "triton.toml"
    config.write_text(f'[model]\nsource = "demo"\n[upstream]\ntriton = "{spec}"\n')
    with pytest.raises(ConfigError, match=r"upstream\.triton"):
        load_settings(config)


@pytest.mark.parametrize(
    "value",
    [
        "fgadmin-dxsn2jO7qvMSRc4UzSUPLsqOT3Osn1mTQf5wGLXHCHE",  # the admin key itself, not its hash
        "78ed41e61ac5dec302a49ead6ade898352efa2f2f4061b39836351c3a7cb97d",  # one hex digit short
        " 78ed41e61ac5dec302a49ead6ade898352efa2f2f4061b39836351c3a7cb97dc",
    ],
)
def test_an_admin_key_hash_no_key_can_match_is_refused_at_load(value: str) -> None:
    """Anything but 64 hex digits (the admin key pasted instead of its hash, a digit lost) opened the
    admin API to no key at all: every admin call a 401, and nothing said why."""
    with pytest.raises(msgspec.ValidationError, match=r"keys\.admin_key_sha256.*floodgate keys admin-key"):
        load_settings(overrides={"keys": {"admin_key_sha256": value}})


@pytest.mark.parametrize("value", ["", "ab" * 32, "AB" * 32])
def test_an_admin_key_hash_of_64_hex_digits_or_none_loads(value: str) -> None:
    assert load_settings(overrides={"keys": {"admin_key_sha256": value}}).keys.admin_key_sha256 == value


@pytest.mark.parametrize(
    ("value", "hashes"),
    [
        ("", ()),
        ([], ()),
        ("AB" * 32, ("ab" * 32,)),
        (["ab" * 32, "CD" * 32], ("ab" * 32, "cd" * 32)),
    ],
)
def test_admin_key_hashes_are_one_string_or_a_list(value: str | list[str], hashes: tuple[str, ...]) -> None:
    """A list lets an operator add the new admin key's hash, move every tool to it, then remove the
    old one: no moment where either key is refused."""
    keys = load_settings(overrides={"keys": {"admin_key_sha256": value}}).keys
    assert keys.admin_key_hashes == hashes


def test_a_list_of_admin_key_hashes_loads_from_the_file(tmp_path: Path) -> None:
    config = tmp_path / "rotating.toml"
    config.write_text(f'[keys]\nadmin_key_sha256 = ["{"ab" * 32}", "{"cd" * 32}"]\n', encoding="utf-8")
    assert load_settings(config).keys.admin_key_hashes == ("ab" * 32, "cd" * 32)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (["ab" * 32, "fgadmin-dxsn2jO7qvMSRc4UzSUPLsqOT3Osn1mTQf5wGLXHCHE"], r"admin_key_sha256\[1\]"),
        (["ab" * 31], r"admin_key_sha256\[0\]"),
        (["ab" * 32, ""], r"admin_key_sha256\[1\]"),
    ],
)
def test_each_admin_key_hash_of_a_list_is_checked(value: list[str], named: str) -> None:
    """One bad entry would open the admin API to no key at that place in the list; an empty one
    in a list is a mistake too (an empty string alone means no admin API)."""
    with pytest.raises(msgspec.ValidationError, match=rf"keys\.{named}.*floodgate keys admin-key"):
        load_settings(overrides={"keys": {"admin_key_sha256": value}})


@pytest.mark.parametrize(
    ("saved_as", "text"),
    [
        ("utf-16", "[server]\nport = 0\n"),  # Windows Notepad's "Unicode"
        ("latin-1", "# the café's edge\n[server]\nport = 0\n"),
    ],
)
def test_a_settings_file_not_in_utf_8_is_said_not_a_traceback(
    tmp_path: Path, saved_as: str, text: str
) -> None:
    """TOML is UTF-8; a file saved otherwise was a UnicodeDecodeError traceback from every command
    that takes --config (read in the locale's encoding, too)."""
    config = tmp_path / "floodgate.toml"
    config.write_bytes(text.encode(saved_as))
    for argv in (["config", "show"], ["serve"], ["keys", "list"]):
        command = [sys.executable, "-m", "edge.cli", *argv, "--config", str(config)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == f"floodgate: invalid settings: {config}: not UTF-8 text (TOML is UTF-8)"


def test_a_settings_file_with_a_utf_8_byte_order_mark_loads(tmp_path: Path) -> None:
    """Notepad's "UTF-8 with BOM": the mark read as a statement, "Invalid statement (at line 1,
    column 1)", for a file that is right."""
    config = tmp_path / "floodgate.toml"
    config.write_bytes(b"\xef\xbb\xbf[server]\nport = 8123\n")
    assert load_settings(config).server.port == 8123


@pytest.mark.parametrize("field", ["send_buffer_bytes", "listen_backlog"])
def test_a_socket_setting_past_a_c_int_is_refused_at_serve(tmp_path: Path, field: str) -> None:
    """The kernel reads both as a C int: send_buffer_bytes of 4 GiB was a TypeError traceback from
    the listener's setsockopt, listen_backlog of 2**32 an OverflowError traceback from uvicorn's
    listen, after the model's import and the dev key's creation (exit 1 with a traceback both)."""
    config = tmp_path / "floodgate.toml"
    config.write_text(f'[server]\nport = 0\nops_port = 0\n{field} = 4294967296\n[model]\nsource = "demo"\n')
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "invalid settings" in done.stderr and f"server.{field}" in done.stderr
    assert "Try it" not in done.stdout  # refused before the dev key's hint


@pytest.mark.parametrize(
    ("text", "section"),
    [
        # An array of tables, as many TOML files write a list of named things.
        ('[[tiers]]\nname = "free"\nmax_tokens = 512\n', "tiers"),
        ('tiers = ["free", "paid"]\n', "tiers"),
        ('[[models]]\nsource = "demo"\n', "models"),
        ('models = ["floodgate-demo"]\n', "models"),
    ],
)
def test_tiers_or_models_not_a_table_of_tables_is_refused_in_one_line(
    tmp_path: Path, text: str, section: str
) -> None:
    """`[[tiers]]` (or `models = [...]`) was an AttributeError traceback ('list' object has no
    attribute 'items') from every command taking --config: serve, config show, keys."""
    config = tmp_path / "floodgate.toml"
    config.write_text(text)
    command = [sys.executable, "-m", "edge.cli", "config", "show", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("floodgate: invalid settings: ") and len(done.stderr.splitlines()) == 1
    assert f"[{section}.NAME]" in done.stderr


@pytest.mark.parametrize("value", ["5", '"paid"', "[1]"])
def test_a_tier_not_a_table_beside_the_files_models_is_refused_in_one_line(
    tmp_path: Path, value: str
) -> None:
    """With [models.*] in the file, `[tiers] free = 5` (a tier that is no table) was a TypeError or
    ValueError traceback from the models' tier lists, not msgspec's line naming the tier (as it is
    without [models.*])."""
    config = tmp_path / "floodgate.toml"
    config.write_text(f'[models.small]\nsource = "demo"\n[tiers]\nfree = {value}\n')
    with pytest.raises(ConfigError, match=r"Expected `object`, got `\w+` - at `\$\.tiers\.free`"):
        load_settings(config)


@pytest.mark.parametrize("field", ["host", "ops_host"])
def test_an_empty_listen_address_is_refused_at_load(field: str) -> None:
    """`ops_host = ""` (or host) loaded and bound every interface of the machine (the socket's
    empty address is INADDR_ANY): the operator endpoints, /metrics and /v1/admin/* among them, open
    to the whole network, while a setting left empty reads as "off" or "the default"."""
    with pytest.raises(msgspec.ValidationError, match=rf"server\.{field}"):
        load_settings(overrides={"server": {field: ""}})
    assert getattr(load_settings(overrides={"server": {field: "0.0.0.0"}}).server, field) == "0.0.0.0"


@pytest.mark.parametrize("section", ["messages", "keys"])
@pytest.mark.parametrize("table", ["", "my table", "ab"])
def test_a_dynamodb_table_name_dynamodb_refuses_is_refused_at_load(section: str, table: str) -> None:
    """Loaded, botocore refused the name itself (ParamValidationError, before any request) as the
    app started, after the model's import: exit 3, a traceback inside a JSON log line."""
    overrides = {section: {"backend": "dynamodb", "dynamodb_table": table}}
    with pytest.raises(msgspec.ValidationError, match=rf"{section}\.dynamodb_table {table!r}"):
        load_settings(overrides=overrides)
    arn = "arn:aws:dynamodb:us-east-1:123456789012:table/floodgate-x"
    for good in ("floodgate-x", "a.b_c-1", arn):
        assert load_settings(overrides={section: {"backend": "dynamodb", "dynamodb_table": good}})
    # The sqlite backend reads no table name.
    assert load_settings(overrides={section: {"dynamodb_table": table}})


def test_serve_with_an_empty_messages_table_exits_with_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "floodgate.toml"
    config.write_text(
        '[server]\nport = 0\nops_port = 0\ndev_key = false\n[model]\nsource = "demo"\nname = "demo"\n'
        '[messages]\nbackend = "dynamodb"\ndynamodb_table = ""\ndynamodb_endpoint = "http://127.0.0.1:9"\n'
    )
    aws = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, **aws}
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "invalid settings" in done.stderr and "messages.dynamodb_table ''" in done.stderr


@pytest.mark.parametrize("section", ["messages", "keys"])
@pytest.mark.parametrize("path", [":memory:", ""])
def test_a_sqlite_store_in_memory_is_refused_at_load(section: str, path: str) -> None:
    """messages.sqlite_path = ":memory:" loaded (keys.sqlite_path was refused): each edge worker,
    each connection even, kept the conversations of its own, and a history read elsewhere, or after
    a restart, found none of them."""
    with pytest.raises(msgspec.ValidationError, match=rf"{section}\.sqlite_path {path!r} must name a file"):
        load_settings(overrides={section: {"sqlite_path": path}})
    # The dynamodb backend reads no file.
    assert load_settings(overrides={section: {"backend": "dynamodb", "sqlite_path": path}})


@pytest.mark.parametrize(
    ("url", "cluster"),
    [
        ("redis+cluster://:hunter2@cache:7000/3", False),
        ("rediss+cluster://cache:7000/?db=2", False),
        ("redis://:hunter2@cache:7000/1", True),
    ],
)
def test_a_redis_cluster_url_naming_a_database_but_0_is_refused_at_load(
    tmp_path: Path, url: str, cluster: bool
) -> None:
    """A cluster has database 0 alone: the URL loaded, and the app's start ended in redis-py's
    RedisClusterException traceback ("Argument 'db' must be 0 or None in cluster mode")."""
    config = tmp_path / "redis.toml"
    config.write_text(
        f'[limiter]\nbackend = "redis"\nredis_url = "{url}"\nredis_cluster = {str(cluster).lower()}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    said = str(caught.value)
    assert said.startswith(f"{config}: limiter.redis_url: a Redis Cluster has database 0 alone"), said
    assert "hunter2" not in said
    for good in ("redis+cluster://cache:7000/0", "redis+cluster://cache:7000/", "redis://cache:7000/1"):
        assert load_settings(overrides={"limiter": {"backend": "redis", "redis_url": good}})


@pytest.mark.parametrize("table", ["model", "models.floodgate-demo"])
@pytest.mark.parametrize("top_p", [1e-40, 1e-300, 5e-324])
def test_a_default_top_p_a_replica_reads_as_zero_is_refused_at_load(
    tmp_path: Path, table: str, top_p: float
) -> None:
    """Above 0 alone, a default_top_p below float32's smallest normal number loaded and went to the
    replicas as written, where a Triton replica's FP32 tensor holds it as 0 (or denormal), which
    TensorRT-LLM refuses: every request that omitted top_p failed. A request's own top_p is raised
    to that number (edge/schemas.py replica_top_p); a setting is refused, naming it and the file."""
    config = tmp_path / "top_p.toml"
    config.write_text(f"[{table}]\ndefault_top_p = {top_p!r}\n")
    with pytest.raises(
        ConfigError, match=rf"top_p\.toml: {re.escape(table)}\.default_top_p = {top_p!r}: below"
    ):
        load_settings(config)
    # Its edges are (0, 1], and float32's smallest normal number loads, as 1 does.
    for bad in (0.0, -0.1, 1.5):
        config.write_text(f"[{table}]\ndefault_top_p = {bad!r}\n")
        with pytest.raises(ConfigError, match=rf"{re.escape(table)}\.default_top_p"):
            load_settings(config)
    for good in (FLOAT32_MIN_NORMAL, 1.0):
        config.write_text(f"[{table}]\ndefault_top_p = {good!r}\n")
        settings = load_settings(config)
        model = settings.model if table == "model" else settings.models["floodgate-demo"]
        assert model.default_top_p == good


@pytest.mark.parametrize("interval_s", [45, 90, 120])
def test_a_cloudwatch_interval_that_does_not_divide_the_scaling_period_is_refused(interval_s: float) -> None:
    """Each call is credited to one of the policies' minutes (edge/scaling/publisher.py): every 45 s,
    minutes would read one call's samples or two; every 120 s, every other minute none."""
    with pytest.raises(ConfigError, match=rf"metrics\.cloudwatch_interval_s = {interval_s}: .* 60 s period"):
        load_settings(overrides={"metrics": {"cloudwatch": True, "cloudwatch_interval_s": interval_s}})
    for divides in (60, 30, 5, 0.1):
        load_settings(overrides={"metrics": {"cloudwatch": True, "cloudwatch_interval_s": divides}})


# Each loaded, and with the redis limiter every admit failed on Redis ("ERR value is not an integer
# or out of range": a slot TTL of 1e14 s is past what PEXPIRE's milliseconds take through Lua, a
# window of 1e17 s past its microseconds) and fell back to the local limiter, or, with
# on_store_failure = "closed", was a 503; a heartbeat of 1e13 s kept the fleet unreachable for good.
@pytest.mark.parametrize(
    ("table", "field", "value"),
    [
        ("limiter", "slot_ttl_s", 1e14),
        ("tiers.paid", "request_window_s", 1e17),
        ("tiers.paid", "token_window_s", 1e17),
        ("tiers.paid", "history_read_window_s", 1e17),
        ("fleet", "heartbeat_s", 1e13),
        ("fleet", "member_ttl_s", 1e13),
        ("fleet", "stale_after_s", 1e13),
    ],
)
def test_a_duration_past_a_hundred_years_is_refused_at_load(table: str, field: str, value: float) -> None:
    overrides: dict[str, Any] = {field: value}
    for name in reversed(table.split(".")):
        overrides = {name: overrides}
    with pytest.raises(msgspec.ValidationError, match=rf"<= {MAX_PERIOD_S}.*{field}"):
        load_settings(overrides=overrides)


@pytest.mark.anyio
async def test_the_longest_slot_ttl_and_window_a_redis_limiter_admits_with() -> None:
    """At the settings' bound (100 years) a real Redis takes every expiry the limiter sets."""
    longest = {
        "limiter": {"slot_ttl_s": MAX_PERIOD_S},
        "tiers": {"paid": {"request_window_s": MAX_PERIOD_S, "token_window_s": MAX_PERIOD_S}},
    }
    settings = load_settings(overrides=longest)
    server = start_redis()
    try:
        limiter = create_limiter("redis", server.url, 2000, 1, lease_ttl_s=settings.limiter.slot_ttl_s)
        closed = msgspec.structs.replace(settings.tiers["paid"], on_store_failure="closed")
        admission = await limiter.admit("u", "r1", closed, 10, 10)  # closed: a store failure raises
        assert admission.decision.allowed
        await limiter.aclose()
    finally:
        server.stop()
