"""A settings file overrides field by field: what it omits keeps its default, what is unknown or
missing is refused naming the setting and the file, and `config show` masks secrets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge.config import ConfigError, load_settings
from edge.settings_view import effective_toml


def test_a_partial_tier_keeps_the_defaults_it_omits(tmp_path: Path) -> None:
    config = tmp_path / "my.toml"
    config.write_text("[tiers.free]\nmax_tokens = 7\n[limiter]\ntimeout_ms = 99\n")
    settings, defaults = load_settings(config), load_settings()
    assert settings.tiers["free"].max_tokens == 7
    assert settings.tiers["free"].priority == defaults.tiers["free"].priority
    assert settings.tiers["free"].tokens_per_window == defaults.tiers["free"].tokens_per_window
    assert settings.tiers["paid"] == defaults.tiers["paid"]
    assert settings.limiter.timeout_ms == 99 and settings.limiter.backend == defaults.limiter.backend


def test_an_unknown_key_is_refused_naming_it_and_the_file(tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text("[server]\nprot = 1\n[tiers.free]\nmax_token = 7\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    message = str(caught.value)
    assert str(config) in message and "server.prot" in message and "tiers.free.max_token" in message


def test_an_unknown_section_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text("[limitter]\nbackend = 'redis'\n")
    with pytest.raises(ConfigError, match=r"unknown setting limitter"):
        load_settings(config)


def test_a_new_tier_must_give_every_field(tmp_path: Path) -> None:
    config = tmp_path / "gold.toml"
    config.write_text("[tiers.gold]\npriority = 20\n")
    with pytest.raises(ConfigError, match=r"gold\.toml: missing setting tiers\.gold\.requests_per_window"):
        load_settings(config)


def test_a_bad_value_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[limiter]\ninstance_count = 0\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: .*instance_count"):
        load_settings(config)


def test_effective_settings_mask_secrets_and_load_back() -> None:
    settings = load_settings(
        overrides={
            "limiter": {"redis_url": "rediss://default:hunter2@cache:6379/0"},
            "keys": {"admin_key_sha256": "ab" * 32},
        }
    )
    text = effective_toml(settings)
    assert "hunter2" not in text and "ab" * 32 not in text
    assert 'redis_url = "rediss://default:****@cache:6379/0"' in text
    # redis-py reads a password from the query string too (printed whole before, a review).
    query = load_settings(
        overrides={"limiter": {"redis_url": "rediss://cache:6379/0?password=hunter2&ssl=1"}}
    )
    assert 'redis_url = "rediss://cache:6379/0?password=****&ssl=1"' in effective_toml(query)
    assert "tokens_per_window = 40000" in text  # a limit named like a token is not a secret


def test_config_show_masks_every_admin_key_hash_of_a_list() -> None:
    """A list of hashes (an admin key being rotated) is as secret as one: each is masked, and how
    many there are still shows."""
    hashes = ["ab" * 32, "cd" * 32]
    text = effective_toml(load_settings(overrides={"keys": {"admin_key_sha256": hashes}}))
    assert "ab" * 32 not in text and "cd" * 32 not in text
    assert 'admin_key_sha256 = ["****", "****"]' in text


def test_config_show_prints_the_merged_settings(tmp_path: Path) -> None:
    config = tmp_path / "my.toml"
    config.write_text('[tiers.free]\nmax_tokens = 7\n[limiter]\nredis_url = "redis://:pw123@h:1/0"\n')
    command = [sys.executable, "-m", "edge.cli", "config", "show", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "max_tokens = 7" in done.stdout and "pw123" not in done.stdout
    assert "[tiers.paid]" in done.stdout


@pytest.mark.parametrize("password", ["ab#cd", "ab/cd", "ab?cd", "a:b#c"])
def test_config_show_masks_a_password_the_url_parser_misreads(password: str) -> None:
    """A password with '#', '/' or '?' not percent-encoded (an AUTH token pasted as generated) ends
    the URL's authority early: the parser saw no '@' there, and `config show` printed it whole."""
    url = f"rediss://default:{password}@cache:6379/0"
    settings = load_settings(overrides={"limiter": {"redis_url": url}})
    text = effective_toml(settings)
    assert password not in text
    assert 'redis_url = "rediss://****@cache:6379/0"' in text


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[tiers.free]\nmax_concurrent = 0\n", "tiers.free.max_concurrent"),
        ('[models.a]\nsource = "demo"\n[models.b]\ntoken_weight = 0\n', "models.b.token_weight"),
    ],
)
def test_a_bad_value_in_a_named_table_names_the_table(tmp_path: Path, text: str, where: str) -> None:
    """msgspec writes a dict's key as [...]: the message said `$.tiers[...].max_concurrent`, not
    which of the tiers (or models) held it."""
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=rf"bad\.toml: .* at `\$\.{where}`"):
        load_settings(config)


@pytest.mark.parametrize(
    ("url", "secret", "shown"),
    [
        # A query password holding '@': the misread-userinfo rule above printed its tail as a host.
        ("rediss://cache:6379/0?password=ab@tail7", "tail7", "rediss://cache:6379/0?password=****"),
        # A misread userinfo and a query password both: the query's was printed whole.
        ("rediss://u:ab#cd@cache:6379/0?password=qpw9", "qpw9", "rediss://****@cache:6379/0?password=****"),
    ],
)
def test_config_show_masks_a_query_password_beside_an_at_sign(url: str, secret: str, shown: str) -> None:
    settings = load_settings(overrides={"limiter": {"redis_url": url}})
    text = effective_toml(settings)
    assert secret not in text
    assert f'redis_url = "{shown}"' in text


def test_config_show_masks_a_unix_socket_urls_query_password() -> None:
    """redis-py reads `unix:///path?password=…` too; a URL with no host was shown as it is."""
    url = "unix:///run/redis/redis.sock?db=2&password=sockpw5"
    text = effective_toml(load_settings(overrides={"limiter": {"redis_url": url}}))
    assert "sockpw5" not in text
    assert 'redis_url = "unix:///run/redis/redis.sock?db=2&password=****"' in text
