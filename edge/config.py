"""Settings: the embedded defaults (defaults.toml) overlaid with an optional user TOML file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

DEFAULTS_PATH = Path(__file__).with_name("defaults.toml")
# A queued request holds its concurrency slot without refreshing it: the slot must outlive the
# longest queue wait by this much, or it could expire under a request that is about to run.
SLOT_TTL_MARGIN_S = 60.0


class ConfigError(ValueError):
    """Settings that parse but cannot work together."""


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True):
    host: str
    port: int
    keys_file: str
    max_body_bytes: int
    keepalive_s: float
    dev_key: bool


class ModelConfig(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    demo_dir: str
    name: str


class EngineSettings(msgspec.Struct, forbid_unknown_fields=True):
    replicas: int
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


class LimiterConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["memory", "redis"]
    redis_url: str
    timeout_ms: int
    instance_count: Annotated[int, msgspec.Meta(ge=1)]
    slot_ttl_s: Annotated[float, msgspec.Meta(gt=0)]
    redis_cluster: bool


class UpstreamConfig(msgspec.Struct, forbid_unknown_fields=True):
    triton: str
    discovery_interval_s: Annotated[float, msgspec.Meta(gt=0)]
    region: str


class AdmissionConfig(msgspec.Struct, forbid_unknown_fields=True):
    reserved_paid_fraction: float
    max_queue: int


class MessagesConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["sqlite", "dynamodb"]
    sqlite_path: str
    dynamodb_table: str
    dynamodb_endpoint: str
    queue_size: int
    ttl_days: Annotated[float, msgspec.Meta(gt=0)]


class MetricsConfig(msgspec.Struct, forbid_unknown_fields=True):
    cloudwatch: bool
    cloudwatch_region: str
    cloudwatch_interval_s: Annotated[float, msgspec.Meta(gt=0)]


class TierConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    priority: int
    requests_per_window: int
    request_window_s: float
    tokens_per_window: int
    token_window_s: float
    max_concurrent: int
    max_tokens: int
    max_queue_wait_s: float
    on_store_failure: Literal["open", "closed"]


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    server: ServerConfig
    model: ModelConfig
    engine: EngineSettings
    upstream: UpstreamConfig
    limiter: LimiterConfig
    admission: AdmissionConfig
    messages: MessagesConfig
    metrics: MetricsConfig
    tiers: dict[str, TierConfig]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if key == "tiers" and isinstance(value, dict):
            # A tier named in the override replaces the default tier whole, new tiers are added.
            out[key] = {**base.get(key, {}), **value}
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merge(base[key], value)
        else:
            out[key] = value
    return out


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Defaults, then the TOML file at `path`, then `overrides` (same nested shape)."""
    data = tomllib.loads(DEFAULTS_PATH.read_text())
    if path is not None:
        data = _merge(data, tomllib.loads(Path(path).read_text()))
    if overrides:
        data = _merge(data, overrides)
    settings = msgspec.convert(data, Settings)
    _check_slot_ttl(settings)
    return settings


def _check_slot_ttl(settings: Settings) -> None:
    ttl = settings.limiter.slot_ttl_s
    for name, tier in settings.tiers.items():
        if tier.max_queue_wait_s + SLOT_TTL_MARGIN_S > ttl:
            raise ConfigError(
                f"tiers.{name}.max_queue_wait_s = {tier.max_queue_wait_s:g} s needs limiter.slot_ttl_s of "
                f"at least {tier.max_queue_wait_s + SLOT_TTL_MARGIN_S:g} s (the wait plus "
                f"{SLOT_TTL_MARGIN_S:g} s), but it is {ttl:g} s: a queued request's concurrency slot "
                "would expire. Raise limiter.slot_ttl_s or lower the tier's max_queue_wait_s."
            )
